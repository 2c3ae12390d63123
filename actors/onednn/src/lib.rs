//! No Rust code: this package only tells dependent build scripts where the prebuilt oneDNN
//! library and headers are (`DEP_DNNL_ROOT`, `DEP_DNNL_INCLUDE_PATH`, `DEP_DNNL_LIBRARY_PATH`).
#![no_std]
