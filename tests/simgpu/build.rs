//! Gives the cdylib the soname of the real driver, so a `libcuda.so.1` symlink to it is what
//! the dynamic loader records in programs linked against it.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
