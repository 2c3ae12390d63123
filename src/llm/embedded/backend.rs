//! llama.cpp's CPU backend: the module built for the best instruction set this CPU has, loaded
//! once per process before the engine starts.

use std::path::Path;

use crate::llm::LlmError;

/// Loads llama.cpp's CPU backend, once per process, before the engine starts: the module built
/// for the best instruction set this CPU has (AMX, AVX-512 VNNI, AVX-512, AVX2...), as its own
/// `ggml_backend_score` rates it. Modules are looked for next to the executable, then in
/// `../lib/callstream` from it (`scripts/install.sh`), then in the directory the build put
/// them in; never in the working directory.
/// Returns the features of the module loaded, such as `AVX512 = 1`.
pub fn cpu_backend() -> Result<&'static str, LlmError> {
    static LOADED: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    LOADED
        .get_or_init(load_cpu_backend)
        .as_deref()
        .map_err(|e| LlmError::Engine(e.clone()))
}

pub(super) fn load_cpu_backend() -> Result<String, String> {
    unsafe extern "C" fn quiet(
        _level: llama_cpp_sys_2::ggml_log_level,
        _text: *const std::ffi::c_char,
        _user_data: *mut std::ffi::c_void,
    ) {
    }
    // SAFETY: a callback that does nothing; llama.cpp would log each load to stderr.
    unsafe { llama_cpp_sys_2::llama_log_set(Some(quiet), std::ptr::null_mut()) };
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    let installed = beside.as_ref().map(|dir| dir.join("../lib/callstream"));
    let dirs: Vec<std::path::PathBuf> = beside
        .into_iter()
        .chain(installed)
        .chain(llama_cpp_sys_2::BACKENDS_DIR.map(Into::into))
        .collect();
    let Some(module) = dirs.iter().find_map(|dir| best_cpu_module(dir)) else {
        let dirs: Vec<_> = dirs.iter().map(|d| d.display().to_string()).collect();
        return Err(format!(
            "no llama.cpp CPU module for this CPU in {}",
            dirs.join(" or ")
        ));
    };
    let path = c_path(&module).ok_or_else(|| format!("bad path {}", module.display()))?;
    // SAFETY: a NUL-terminated path; the registry lookups take NUL-terminated names, and the
    // features array the CPU backend returns is static and ends with a null name.
    let features = unsafe {
        let reg = llama_cpp_sys_2::ggml_backend_load(path.as_ptr());
        if reg.is_null() {
            return Err(format!("cannot load {}", module.display()));
        }
        let get = llama_cpp_sys_2::ggml_backend_reg_get_proc_address(
            reg,
            c"ggml_backend_get_features".as_ptr(),
        );
        let get = std::mem::transmute::<
            *mut std::ffi::c_void,
            llama_cpp_sys_2::ggml_backend_get_features_t,
        >(get);
        let mut features = Vec::new();
        if let Some(get) = get {
            let mut feature = get(reg);
            while !feature.is_null() && !(*feature).name.is_null() {
                let name = std::ffi::CStr::from_ptr((*feature).name).to_string_lossy();
                let value = std::ffi::CStr::from_ptr((*feature).value).to_string_lossy();
                features.push(format!("{name} = {value}"));
                feature = feature.add(1);
            }
        }
        features.join(", ")
    };
    tracing::info!(module = %module.display(), %features, "llama.cpp CPU backend loaded");
    Ok(features)
}

/// The CPU module in `dir` (`libggml-cpu-<level>.so`) its own score rates highest
/// on this CPU; a module that cannot run here rates 0 and is not a candidate.
pub(super) fn best_cpu_module(dir: &Path) -> Option<std::path::PathBuf> {
    let mut best: Option<(i32, std::path::PathBuf)> = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with("libggml-cpu-") || !name.ends_with(".so") {
            continue;
        }
        let path = entry.path();
        let Some(c) = c_path(&path) else { continue };
        // SAFETY: the module is opened only to call its `int ggml_backend_score(void)`, which
        // reads CPUID (llama.cpp's own loader does the same), then closed.
        let score = unsafe {
            let handle = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            if handle.is_null() {
                continue;
            }
            let score = libc::dlsym(handle, c"ggml_backend_score".as_ptr());
            let score = if score.is_null() {
                0
            } else {
                let score: extern "C" fn() -> std::ffi::c_int = std::mem::transmute(score);
                score()
            };
            libc::dlclose(handle);
            score
        };
        if score > 0 && best.as_ref().is_none_or(|(s, _)| score > *s) {
            best = Some((score, path));
        }
    }
    best.map(|(_, path)| path)
}

pub(super) fn c_path(path: &Path) -> Option<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes()).ok()
}
