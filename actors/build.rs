//! Lets this package's programs (its tests) find the prebuilt oneDNN without
//! `LD_LIBRARY_PATH`: its library directory goes into their `RPATH`.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_DNNL_LIBRARY_PATH");
    if let Ok(dir) = std::env::var("DEP_DNNL_LIBRARY_PATH") {
        println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags,-rpath,{dir}");
    }
}
