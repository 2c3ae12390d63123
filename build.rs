//! Lets the programs built from this package find their shared libraries without
//! `LD_LIBRARY_PATH`: first beside the program or in `../lib/callstream` from it (where
//! `scripts/install.sh` puts them), else where the build left them: llama.cpp's in the
//! llama-cpp-sys-2 build's `lib` directory, next to the `backends` directory its build script
//! reports, and oneDNN's where `scripts/onednn.py` installed it. `RPATH` (not `RUNPATH`) so
//! that the libraries find each other through it too.
//!
//! Also warns when llama.cpp's CMake in this target directory was configured with another
//! include than the one the build asks for: CMake records the path once per directory, and
//! scripts/build-env.sh corrects it, so only a build run without the scripts sees this.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-env-changed=CMAKE_PROJECT_INCLUDE");
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_BACKENDS_DIR");
    println!("cargo:rerun-if-env-changed=DEP_DNNL_LIBRARY_PATH");
    // llama-cpp-sys-2's install directory: `backends`, `lib` and CMake's `build` are in it.
    let llama = std::env::var("DEP_LLAMA_BACKENDS_DIR")
        .ok()
        .and_then(|backends| Path::new(&backends).parent().map(Path::to_path_buf));
    if let (Some(out), Ok(asked)) = (&llama, std::env::var("CMAKE_PROJECT_INCLUDE")) {
        let cache = std::fs::read_to_string(out.join("build/CMakeCache.txt")).unwrap_or_default();
        let built = cache
            .lines()
            .find_map(|line| line.strip_prefix("CMAKE_PROJECT_INCLUDE:"))
            .and_then(|entry| entry.split_once('=').map(|(_, path)| path));
        if let Some(built) = built.filter(|built| Path::new(built) != Path::new(&asked)) {
            println!(
                "cargo:warning=llama.cpp in this target directory reads its CMake include from \
                 {built}, not {asked}: it was configured from another place (see \
                 scripts/build-env.sh); a new target directory takes the current one"
            );
        }
    }
    let mut path = vec!["$ORIGIN".to_owned(), "$ORIGIN/../lib/callstream".to_owned()];
    if let Some(out) = &llama {
        for lib in ["lib", "lib64"] {
            let dir = out.join(lib);
            if dir.is_dir() {
                path.push(dir.display().to_string());
            }
        }
    }
    if let Ok(dir) = std::env::var("DEP_DNNL_LIBRARY_PATH") {
        path.push(dir);
    }
    println!(
        "cargo:rustc-link-arg=-Wl,--disable-new-dtags,-rpath,{}",
        path.join(":")
    );
}
