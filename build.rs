//! Lets the programs built from this package find llama.cpp's shared libraries without
//! `LD_LIBRARY_PATH`: first beside the program or in `../lib/callstream` from it (where
//! `scripts/install.sh` puts them), else in the llama-cpp-sys-2 build's `lib` directory, next to
//! the `backends` directory its build script reports. `RPATH` (not `RUNPATH`) so that the
//! libraries find each other through it too.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_BACKENDS_DIR");
    let Ok(backends) = std::env::var("DEP_LLAMA_BACKENDS_DIR") else {
        return;
    };
    let Some(out) = std::path::Path::new(&backends).parent() else {
        return;
    };
    let mut path = vec!["$ORIGIN".to_owned(), "$ORIGIN/../lib/callstream".to_owned()];
    for lib in ["lib", "lib64"] {
        let dir = out.join(lib);
        if dir.is_dir() {
            path.push(dir.display().to_string());
        }
    }
    println!(
        "cargo:rustc-link-arg=-Wl,--disable-new-dtags,-rpath,{}",
        path.join(":")
    );
}
