//! Workload: the memory manager's error cases and reports, one per mode.
//!
//! `wl_mem <mode>`:
//! - `oom <mib>`: two tensors of `<mib>` MiB each; a copy kernel touching both (more than the
//!   budget under the test's settings) prints its result code; then a launch touching one
//!   tensor, and the data of both, must still be right (`D` lines).
//! - `frees`: the result codes of a double free (sync and stream-ordered) and of freeing a
//!   pointer never allocated (`R` lines, compared with the driver's own).
//! - `info`: what `cuMemGetInfo` reports before and after allocating 6 MiB (`M` lines).
//! - `env`: prints `PYTORCH_CUDA_ALLOC_CONF` as the process sees it (`V` line) and touches
//!   the driver once.
//! - `library <path>`: allocates 4 MiB itself and 4 MiB twice through the library at `<path>`
//!   (`tests/src/fake_cublas.c`, which looks the driver up as cuBLAS does), writes and reads
//!   back all three, frees them, and prints the pointers (`P app|gpa|dlsym <hex>`).

use tensile_driver_abi::{CUdeviceptr, CUDA_SUCCESS};
use tensile_tests::driver::Lookup;
use tensile_tests::expect::fnv1a;
use tensile_tests::session::{kernel, Arg, Form, Session};

const MIB: usize = 1 << 20;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("");
    if mode == "env" {
        let v = std::env::var("PYTORCH_CUDA_ALLOC_CONF").unwrap_or_else(|_| "<unset>".into());
        println!("V {v}");
    }
    let s = Session::start(Lookup::ProcAddress {
        version: 13000,
        flags: 0,
    });
    match mode {
        "oom" => oom(&s, args.get(2).and_then(|a| a.parse().ok()).unwrap_or(6)),
        "frees" => frees(&s),
        "info" => info(&s),
        "env" => {
            let p = s.alloc(4096);
            s.free(p);
        }
        "library" => library(&s, args.get(2).expect("wl_mem library <path>")),
        _ => panic!("usage: wl_mem oom <mib> | frees | info | env | library <path>"),
    }
    s.sync_ctx();
    s.say("done");
}

fn oom(s: &Session, mib: usize) {
    let ks = s.kernels(true);
    let st = s.stream();
    let bytes = mib * MIB;
    let n = (bytes / 4) as u64;
    let (a, b) = (s.alloc(bytes), s.alloc(bytes));
    s.launch(
        kernel(&ks, "fill_pattern"),
        4,
        128,
        st,
        &[Arg::ptr(a), Arg::U64(n), Arg::U32(7)],
        Form::Params,
    );
    s.memset(b, 4, 0x0101_0101, n as usize, Some(st));
    let r = s.try_launch(
        kernel(&ks, "copy_u32"),
        4,
        128,
        st,
        &[Arg::ptr(b), Arg::ptr(a), Arg::U64(n)],
        Form::Params,
    );
    s.say(format!("R copy_both {r}"));
    // Nothing else broke: a launch on one tensor works, and both hold what they should.
    s.launch(
        kernel(&ks, "scale"),
        4,
        128,
        st,
        &[Arg::ptr(b), Arg::F32(2.0), Arg::U64(n)],
        Form::Params,
    );
    s.sync_stream(st);
    s.digest("a", a, bytes);
    s.digest("b", b, bytes);
    s.free(a);
    s.free(b);
}

fn frees(s: &Session) {
    let st = s.stream();
    let p = s.alloc(MIB);
    s.free(p);
    // SAFETY: freeing a freed pointer is the error under test; the driver reports it.
    let r = unsafe { (s.d.cuMemFree)(p) };
    s.say(format!("R double_free {r}"));
    let q = s.alloc_async(MIB, st);
    s.free_async(q, st);
    s.sync_stream(st);
    // SAFETY: as above, stream-ordered.
    let r = unsafe { (s.d.cuMemFreeAsync)(q, st) };
    s.say(format!("R double_free_async {r}"));
    let bogus: CUdeviceptr = 0x1234_5000;
    // SAFETY: a pointer that was never allocated; the driver reports it.
    let r = unsafe { (s.d.cuMemFree)(bogus) };
    s.say(format!("R unknown_free {r}"));
    // The process is still fine.
    let p = s.alloc(MIB);
    s.upload(p, &[7u8; 4096], None);
    let back = s.download(p, 4096, None);
    s.say(format!("D after {:016x}", fnv1a(&back)));
    s.free(p);
}

fn mem_info(s: &Session) -> (usize, usize) {
    let (mut free, mut total) = (0, 0);
    // SAFETY: valid out-pointers.
    let r = unsafe { (s.d.cuMemGetInfo)(&mut free, &mut total) };
    assert_eq!(r, CUDA_SUCCESS, "cuMemGetInfo");
    (free, total)
}

fn info(s: &Session) {
    let (free, total) = mem_info(s);
    s.say(format!("M before {free} {total}"));
    let p = s.alloc(6 * MIB);
    s.memset(p, 1, 1, 6 * MIB, None);
    let (free, total) = mem_info(s);
    s.say(format!("M after {free} {total}"));
    s.free(p);
}

fn library(s: &Session, path: &str) {
    type Alloc = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> i32;
    type Free = unsafe extern "C" fn(CUdeviceptr) -> i32;
    let c_path = std::ffi::CString::new(path).expect("a path without NUL");
    // SAFETY: a valid C string.
    let lib = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW) };
    assert!(!lib.is_null(), "dlopen {path} failed");
    let sym = |name: &std::ffi::CStr| {
        // SAFETY: a live handle and a C string.
        let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
        assert!(!p.is_null(), "{name:?} missing");
        p
    };
    // SAFETY: the library's functions have these C signatures (fake_cublas.c).
    let (by_gpa, by_dlsym, free) = unsafe {
        (
            std::mem::transmute::<*mut libc::c_void, Alloc>(sym(c"fake_alloc_gpa")),
            std::mem::transmute::<*mut libc::c_void, Alloc>(sym(c"fake_alloc_dlsym")),
            std::mem::transmute::<*mut libc::c_void, Free>(sym(c"fake_free")),
        )
    };
    let bytes = 4 * MIB;
    let app = s.alloc(bytes);
    let (mut gpa, mut dl) = (0, 0);
    // SAFETY: valid out-pointers.
    let (r1, r2) = unsafe { (by_gpa(&mut gpa, bytes), by_dlsym(&mut dl, bytes)) };
    assert_eq!((r1, r2), (0, 0), "the library's allocations failed");
    for (name, p) in [("app", app), ("gpa", gpa), ("dlsym", dl)] {
        s.say(format!("P {name} {p:x}"));
        let data: Vec<u8> = (0..4096u32).map(|i| (i as u8) ^ name.len() as u8).collect();
        s.upload(p, &data, None);
        let back = s.download(p, 4096, None);
        assert_eq!(back, data, "{name}: data lost");
    }
    s.free(app);
    // SAFETY: pointers the library allocated.
    let (r1, r2) = unsafe { (free(gpa), free(dl)) };
    assert_eq!((r1, r2), (0, 0), "the library's frees failed");
}
