//! Workload: asks `cuGetProcAddress_v2` (found with `dlsym` on a handle of libcuda, as
//! libcudart does) every (name, version, flags) question of a list, and the CUDA 11.3
//! `cuGetProcAddress` (fetched through the first) the same, and prints each answer with the
//! library and symbol the returned pointer belongs to (`dladdr`).
//!
//! `wl_lookups <file>`: lines of `name version flags`, `#` comments.
//! Output: `L <v1|v2> <name> <version> <flags> <result> <status> <library> <same>`, where
//! `<same>` is `1` when the answer is what `dlsym(handle, <versioned symbol>)` gives (the
//! symbol `cudaTypedefs.h` names for the question), `0` when not, `-` without an answer (an
//! address, not a name from `dladdr`: a release build may fold identical functions), and
//! first `N dlsym <library>`: where `dlsym(RTLD_NEXT, "dlsym")` from the program leads.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;

use tensile_driver_abi::{resolve_proc, ProcLookup};

type GetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64, *mut i32) -> u32;
type GetProcAddress = unsafe extern "C" fn(*const c_char, *mut *mut c_void, i32, u64) -> u32;

/// (library file name, symbol name) of the function at `p`.
fn owner(p: *mut c_void) -> (String, String) {
    if p.is_null() {
        return ("-".into(), "-".into());
    }
    // SAFETY: Dl_info is plain data; dladdr fills it for any address.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    if unsafe { libc::dladdr(p, &mut info) } == 0 {
        return ("?".into(), "?".into());
    }
    let cstr = |s: *const c_char| {
        if s.is_null() {
            "-".to_owned()
        } else {
            // SAFETY: dladdr's strings are NUL-terminated.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        }
    };
    let lib = cstr(info.dli_fname);
    let lib = Path::new(&lib)
        .file_name()
        .map_or(lib.clone(), |f| f.to_string_lossy().into_owned());
    (lib, cstr(info.dli_sname))
}

/// Whether `p` is what `dlsym` on the driver handle gives for the versioned symbol that
/// answers (name, version, flags).
fn same_as_dlsym(
    h: *mut c_void,
    p: *mut c_void,
    name: &str,
    version: i32,
    flags: u64,
) -> &'static str {
    let ProcLookup::Found(entry) = resolve_proc(name, version, flags) else {
        return "-";
    };
    if p.is_null() {
        return "-";
    }
    let c = CString::new(entry.symbol).expect("no NUL in symbols");
    // SAFETY: a live handle and a C string.
    let q = unsafe { libc::dlsym(h, c.as_ptr()) };
    if p == q {
        "1"
    } else {
        "0"
    }
}

fn main() {
    // glibc resolves RTLD_NEXT relative to the caller: from this program, the next `dlsym`
    // is the preloaded one if there is one. An override that called glibc from its own body
    // would make this answer libc's.
    // SAFETY: a C string literal.
    let next = unsafe { libc::dlsym(libc::RTLD_NEXT, c"dlsym".as_ptr()) };
    println!("N dlsym {}", owner(next).0);
    let file = std::env::args().nth(1).expect("usage: wl_lookups <file>");
    let text = std::fs::read_to_string(&file).expect("reading the lookup list");
    // SAFETY: C string literals.
    let h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null(), "dlopen libcuda.so.1");
    // SAFETY: a live handle.
    let p = unsafe { libc::dlsym(h, c"cuGetProcAddress_v2".as_ptr()) };
    assert!(!p.is_null(), "dlsym cuGetProcAddress_v2");
    // SAFETY: the driver's cuGetProcAddress_v2 has this signature.
    let v2 = unsafe { std::mem::transmute::<*mut c_void, GetProcAddressV2>(p) };
    // SAFETY: C string literal, valid out-pointers; cuInit(0) first as a runtime would.
    unsafe {
        let mut init = std::ptr::null_mut();
        let mut st = 0;
        assert_eq!(v2(c"cuInit".as_ptr(), &mut init, 2000, 0, &mut st), 0);
        let init: unsafe extern "C" fn(u32) -> u32 = std::mem::transmute(init);
        assert_eq!(init(0), 0);
    }
    let mut v1_ptr = std::ptr::null_mut();
    let mut st = 0;
    // SAFETY: valid out-pointers.
    let r = unsafe { v2(c"cuGetProcAddress".as_ptr(), &mut v1_ptr, 11030, 0, &mut st) };
    assert_eq!(r, 0);
    // SAFETY: ("cuGetProcAddress", 11030) is the 4-argument ABI.
    let v1 = unsafe { std::mem::transmute::<*mut c_void, GetProcAddress>(v1_ptr) };
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (name, version, flags): (&str, i32, u64) = (
            f[0],
            f[1].parse().expect("version"),
            f[2].parse().expect("flags"),
        );
        let c = CString::new(name).expect("no NUL in names");
        let (mut p, mut status) = (std::ptr::null_mut(), -1);
        // SAFETY: valid C string and out-pointers.
        let r = unsafe { v2(c.as_ptr(), &mut p, version, flags, &mut status) };
        let (lib, _) = owner(p);
        let same = same_as_dlsym(h, p, name, version, flags);
        println!("L v2 {name} {version} {flags} {r} {status} {lib} {same}");
        let mut p1 = std::ptr::null_mut();
        // SAFETY: as above.
        let r1 = unsafe { v1(c.as_ptr(), &mut p1, version, flags) };
        let (lib1, _) = owner(p1);
        let same1 = same_as_dlsym(h, p1, name, version, flags);
        println!("L v1 {name} {version} {flags} {r1} - {lib1} {same1}");
    }
}
