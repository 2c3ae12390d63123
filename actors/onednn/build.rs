//! Finds the prebuilt oneDNN that `scripts/onednn.py` installed: `CALLSTREAM_ONEDNN_DIR`, else
//! `~/.cache/callstream/onednn-3.2.0`. Links it as a shared library (`libdnnl.so.3`); the
//! programs find it at run time through the `RPATH` that the build scripts of `callstream` and
//! `callstream-actors` set from `DEP_DNNL_LIBRARY_PATH`.

use std::path::PathBuf;

fn main() {
    println!("cargo::rerun-if-env-changed=CALLSTREAM_ONEDNN_DIR");
    println!("cargo::rerun-if-env-changed=HOME");
    let root = match std::env::var_os("CALLSTREAM_ONEDNN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            home.join(".cache/callstream/onednn-3.2.0")
        }
    };
    let include = root.join("include");
    let lib = root.join("lib");
    for needed in [include.join("dnnl.hpp"), lib.join("libdnnl.so.3")] {
        if !needed.is_file() {
            panic!(
                "oneDNN is not installed: {} is missing. Run scripts/setup.sh (or \
                 scripts/onednn.py --dir DIR and set CALLSTREAM_ONEDNN_DIR=DIR).",
                needed.display()
            );
        }
        println!("cargo::rerun-if-changed={}", needed.display());
    }
    println!("cargo::rustc-link-search=native={}", lib.display());
    // ct2rs's build script leaves linking the library to this package, as the crate it stands
    // in for does (that one links a static build).
    println!("cargo::rustc-link-lib=dylib=dnnl");
    println!("cargo::metadata=ROOT={}", root.display());
    println!("cargo::metadata=INCLUDE_PATH={}", include.display());
    println!("cargo::metadata=LIBRARY_PATH={}", lib.display());
}
