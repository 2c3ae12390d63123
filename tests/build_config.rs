//! The build's own settings, checked on the files: the C++ engines' bindings are pinned to exact
//! versions, and llama.cpp is built again whenever the CMake include that patches it changes.

use sha2::{Digest, Sha256};

fn root() -> std::path::PathBuf {
    callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap()
}

#[test]
fn the_engines_bindings_are_pinned_exactly() {
    for (manifest, krate) in [
        ("Cargo.toml", "llama-cpp-2"),
        ("Cargo.toml", "llama-cpp-sys-2"),
        ("Cargo.toml", "onednn-src"),
        ("actors/Cargo.toml", "ct2rs"),
        ("actors/Cargo.toml", "onednn-src"),
    ] {
        let text = read(manifest);
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{krate} = ")))
            .unwrap_or_else(|| panic!("{krate} is not a dependency in {manifest}"));
        assert!(
            line.contains("= \"=") || line.contains("version = \"="),
            "{manifest}: {krate} is not pinned to one version: {line}"
        );
    }
}

#[test]
fn a_changed_llama_cpp_include_rebuilds_llama_cpp() {
    let digest = Sha256::digest(read("scripts/cmake/llama-cpp.cmake").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let config = read(".cargo/config.toml");
    let line = config
        .lines()
        .find(|l| l.starts_with("GGML_CALLSTREAM_INCLUDE"))
        .expect("GGML_CALLSTREAM_INCLUDE is not set in .cargo/config.toml");
    assert_eq!(
        line,
        format!("GGML_CALLSTREAM_INCLUDE = \"{}\"", &hex[..16]),
        "scripts/cmake/llama-cpp.cmake changed: set GGML_CALLSTREAM_INCLUDE to the new digest"
    );
}

/// llama.cpp as published: no library of its build (the CPU modules and the shared libraries
/// beside them) defines or calls a `--wrap` symbol, the mark of a function replaced at link time.
#[test]
fn llama_cpp_is_linked_without_wraps() {
    let backends = std::path::Path::new(
        llama_cpp_sys_2::BACKENDS_DIR.expect("llama.cpp's build names its modules' directory"),
    );
    let mut libraries = Vec::new();
    for dir in [
        backends.to_path_buf(),
        backends.parent().unwrap().join("lib"),
    ] {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("lib") && name.contains(".so") && !entry.path().is_symlink() {
                libraries.push(entry.path());
            }
        }
    }
    assert!(
        libraries
            .iter()
            .any(|l| l.to_string_lossy().contains("ggml-cpu-")),
        "no CPU module among {libraries:?}"
    );
    for library in libraries {
        let symbols = std::process::Command::new("nm")
            .args(["-D"])
            .arg(&library)
            .output()
            .unwrap();
        assert!(symbols.status.success(), "nm {}", library.display());
        let symbols = String::from_utf8_lossy(&symbols.stdout);
        assert!(
            symbols.contains("ggml_"),
            "{}: no symbols read",
            library.display()
        );
        for line in symbols.lines() {
            assert!(
                !line.contains("__wrap_") && !line.contains("__real_"),
                "{} is patched at link time: {line}",
                library.display()
            );
        }
    }
}
