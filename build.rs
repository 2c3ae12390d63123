//! Lets the programs built from this package find their shared libraries without
//! `LD_LIBRARY_PATH`: first beside the program or in `../lib/callstream` from it (where
//! `scripts/install.sh` puts them), else where the build left them: llama.cpp's in the
//! llama-cpp-sys-2 build's `lib` directory, next to the `backends` directory its build script
//! reports, and oneDNN's where `scripts/onednn.py` installed it. `RPATH` (not `RUNPATH`) so
//! that the libraries find each other through it too.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_BACKENDS_DIR");
    println!("cargo:rerun-if-env-changed=DEP_DNNL_LIBRARY_PATH");
    let mut path = vec!["$ORIGIN".to_owned(), "$ORIGIN/../lib/callstream".to_owned()];
    if let Some(out) = std::env::var("DEP_LLAMA_BACKENDS_DIR")
        .ok()
        .and_then(|backends| Path::new(&backends).parent().map(Path::to_path_buf))
    {
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
