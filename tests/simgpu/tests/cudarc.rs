//! The built `libcuda.so` as other programs see it: loaded by `cudarc` (dynamic loading,
//! `dlopen("libcuda.so.1")` through LD_LIBRARY_PATH) in a child process, which then drives
//! a context, a stream, allocations, copies and a kernel launch through it.

use std::ffi::{c_void, CString};
use std::path::PathBuf;
use std::process::Command;

use tensile_kernels::twins::pattern_value;

const CHILD_ENV: &str = "TENSILE_SIMGPU_CUDARC_CHILD";

/// The cdylib cargo built for this test run: `deps/libcuda.so` beside the test binary (the
/// copy in the profile directory is only refreshed by `cargo build`).
fn built_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps directory");
    let lib = deps.join("libcuda.so");
    assert!(lib.exists(), "{} was not built", lib.display());
    lib
}

#[test]
fn cudarc_drives_the_simulated_gpu() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child();
        return;
    }
    let lib = built_library();
    let dir = std::env::temp_dir().join(format!("tensile-simgpu-cudarc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["libcuda.so.1", "libcuda.so"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&lib, &link).unwrap();
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "cudarc_drives_the_simulated_gpu",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .env("LD_LIBRARY_PATH", &dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(
        text.contains("cudarc child: ok"),
        "child did not run the scenario:\n{text}"
    );
}

fn child() {
    use cudarc::driver::{result, sys, CudaContext, DevicePtrMut};

    let ctx = CudaContext::new(0).expect("context");
    assert_eq!(ctx.name().expect("name"), "Tensile Simulated GPU");
    let stream = ctx.new_stream().expect("stream");
    let n = 100_000usize;
    let mut buf = stream.alloc_zeros::<u32>(n).expect("alloc");

    let ptx = CString::new(tensile_kernels::PTX).unwrap();
    // SAFETY: a NUL-terminated PTX image, with the context current.
    let module =
        unsafe { result::module::load_data(ptx.as_ptr() as *const c_void) }.expect("module");
    // SAFETY: `module` was just loaded.
    let f = unsafe { result::module::get_function(module, CString::new("fill_pattern").unwrap()) }
        .expect("function");
    {
        let (ptr, _record) = buf.device_ptr_mut(&stream);
        let (mut p, mut len, mut seed): (sys::CUdeviceptr, u64, u32) = (ptr, n as u64, 33);
        let mut params = [
            &mut p as *mut _ as *mut c_void,
            &mut len as *mut _ as *mut c_void,
            &mut seed as *mut _ as *mut c_void,
        ];
        // SAFETY: the parameters match fill_pattern's signature and outlive the call.
        unsafe {
            result::launch_kernel(
                f,
                (16, 1, 1),
                (128, 1, 1),
                0,
                stream.cu_stream(),
                &mut params,
            )
        }
        .expect("launch");
    }
    let host = stream.clone_dtoh(&buf).expect("dtoh");
    let want: Vec<u32> = (0..n as u64).map(|i| pattern_value(33, i)).collect();
    if let Some(i) = host.iter().zip(&want).position(|(a, b)| a != b) {
        panic!(
            "kernel output differs at {i}: {:#x} vs {:#x}",
            host[i], want[i]
        );
    }
    let back = stream.clone_htod(&host).expect("htod");
    assert!(
        stream.clone_dtoh(&back).expect("dtoh") == want,
        "round trip differs"
    );
    stream.synchronize().expect("sync");
    let (free, total) = result::mem_get_info().expect("mem info");
    assert!(free < total);
    println!("cudarc child: ok");
}
