//! Workload: device memory shared between processes through CUDA IPC, as
//! `torch.multiprocessing` shares CUDA tensors.
//!
//! `wl_ipc <mode>`:
//! - `share <others> <mib>`: allocates a 4 MiB tensor (`P shared <hex>`), writes pattern 1,
//!   exports it (`R export`; exporting again gives the same bytes: `R same_handle`) and runs
//!   itself as `open` on the handle (with the same environment, under the shim if this is,
//!   but `TENSILE_POLICY=off`), which checks pattern 1 and writes pattern 2. Then it swaps: `<others>` tensors of `<mib>`
//!   MiB written and read back twice (`C others ok`), and checks the shared tensor holds
//!   pattern 2 (`C shared ok`). Then the lifetime: a `hold` child (with this process's
//!   policy) opens the tensor and waits
//!   while this process frees it and fills new tensors, then checks it still holds pattern
//!   2 (`C held ok`) and closes; an `open` child after that is refused (`R reopen_refused`).
//! - `open <hex> <bytes> <expect> <write>`: opens the handle (`R open`), checks every byte is
//!   pattern `<expect>` (`C seen ok|bad`), opens it again (`R open_again <code> <same
//!   pointer>`) and closes once (`R close`), writes pattern `<write>` (still mapped: one open
//!   is left), closes again (`R close`).
//!   With `<expect>` `-`, only prints what the open returned.
//! - `hold <hex> <bytes>`: opens the handle, prints `ready`, waits for a line on stdin, checks
//!   pattern 2 (`C held ok|bad`), closes.
//! - `handle`: allocates 4 MiB, exports it, prints `H <hex>` and exits.
//! - `foreign`: what the driver answers for its own handles: the export of a `cuMemAlloc`
//!   allocation (`R get`), opening it in the same process (`R open_own`), opening 64 bytes
//!   that are nobody's handle (`R open_garbage`), closing a pointer never opened
//!   (`R close_unknown`).
//! - `too_large <mib>`: allocates `<mib>` MiB, writes it in pieces of 4 MiB, exports it
//!   (`R export`), and checks the data is intact (`C after`, `D after`).

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};

use tensile_driver_abi::{CUdeviceptr, CUipcMemHandle, CUDA_SUCCESS};
use tensile_tests::driver::Lookup;
use tensile_tests::expect::fnv1a;
use tensile_tests::session::Session;

const MIB: usize = 1 << 20;
const SHARED: usize = 4 * MIB;

/// The bytes of pattern `seed`.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64 * 31 + u64::from(seed) * 7) % 251) as u8)
        .collect()
}

fn hex(h: &CUipcMemHandle) -> String {
    h.reserved.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> CUipcMemHandle {
    let mut h = CUipcMemHandle { reserved: [0; 64] };
    assert_eq!(s.len(), 128, "a handle is 64 bytes");
    for (i, b) in h.reserved.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("a hex handle");
    }
    h
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    let s = Session::start(Lookup::ProcAddress {
        version: 13000,
        flags: 0,
    });
    match arg(1) {
        "share" => share(&s, arg(2).parse().unwrap_or(8), arg(3).parse().unwrap_or(4)),
        "open" => open(&s, arg(2), arg(3).parse().expect("bytes"), arg(4), arg(5)),
        "hold" => hold(&s, arg(2), arg(3).parse().expect("bytes")),
        "handle" => {
            let p = s.alloc(SHARED);
            s.upload(p, &pattern(1, SHARED), None);
            let h = export(&s, p);
            s.say(format!("H {}", hex(&h)));
        }
        "foreign" => foreign(&s),
        "too_large" => too_large(&s, arg(2).parse().unwrap_or(16)),
        _ => panic!("usage: wl_ipc share | open | hold | handle | foreign | too_large"),
    }
    s.sync_ctx();
    s.say("done");
}

fn export(s: &Session, p: CUdeviceptr) -> CUipcMemHandle {
    let mut h = CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: a valid out-pointer and a live allocation.
    let r = unsafe { (s.d.cuIpcGetMemHandle)(&mut h, p) };
    s.say(format!("R export {r}"));
    h
}

/// This program again, as `args`, with this process's environment (but no trace: the
/// file is this process's).
fn child(args: &[&str]) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("the workload's path"));
    c.args(args).env_remove("TENSILE_TRACE");
    c
}

/// Runs a child to its end, its output passed through; whether it succeeded. The importer
/// needs libtensile, not its memory manager: this child runs without one.
fn run_child(s: &Session, args: &[&str]) -> bool {
    let out = child(args)
        .env("TENSILE_POLICY", "off")
        .output()
        .expect("running the child");
    s.say(String::from_utf8_lossy(&out.stdout).trim_end());
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    out.status.success()
}

fn share(s: &Session, others: usize, mib: usize) {
    let shared = s.alloc(SHARED);
    s.say(format!("P shared {shared:x}"));
    s.upload(shared, &pattern(1, SHARED), None);
    let h = export(s, shared);
    let again = export(s, shared);
    s.say(format!(
        "R same_handle {}",
        u8::from(h.reserved == again.reserved)
    ));
    let bytes = SHARED.to_string();
    let ok = run_child(s, &["open", &hex(&h), &bytes, "1", "2"]);
    s.say(format!("R child {}", u8::from(ok)));

    // Swap well past the budget, twice over.
    let size = mib * MIB;
    let bufs: Vec<CUdeviceptr> = (0..others).map(|_| s.alloc(size)).collect();
    let mut all_ok = true;
    for round in 0..2u8 {
        for (i, &b) in bufs.iter().enumerate() {
            s.upload(b, &pattern(10 + i as u8 + round, size), None);
        }
        for (i, &b) in bufs.iter().enumerate() {
            all_ok &= s.download(b, size, None) == pattern(10 + i as u8 + round, size);
        }
    }
    s.say(format!("C others {}", if all_ok { "ok" } else { "bad" }));
    let seen = s.download(shared, SHARED, None);
    s.say(format!(
        "C shared {}",
        if seen == pattern(2, SHARED) {
            "ok"
        } else {
            "bad"
        }
    ));

    // Freed while another process has it open: the free waits for that process.
    let mut holder = child(&["hold", &hex(&h), &bytes])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the holder");
    let mut lines = std::io::BufReader::new(holder.stdout.take().expect("its stdout")).lines();
    for line in lines.by_ref() {
        let line = line.expect("the holder's output");
        s.say(&line);
        if line == "ready" {
            break;
        }
    }
    s.free(shared);
    // New tensors where the freed one would be reused, written with another pattern.
    let fresh: Vec<CUdeviceptr> = (0..2).map(|_| s.alloc(SHARED)).collect();
    for &f in &fresh {
        s.upload(f, &pattern(9, SHARED), None);
    }
    s.sync_ctx();
    let mut stdin = holder.stdin.take().expect("its stdin");
    writeln!(stdin, "go").expect("telling the holder");
    drop(stdin);
    for line in lines {
        s.say(line.expect("the holder's output"));
    }
    let held = holder.wait().expect("the holder ran");
    s.say(format!("R holder {}", u8::from(held.success())));
    for &f in &fresh {
        let ok = s.download(f, SHARED, None) == pattern(9, SHARED);
        s.say(format!("C fresh {}", if ok { "ok" } else { "bad" }));
    }
    // The last import ended: the free was carried out, and the export is gone.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let out = child(&["open", &hex(&h), &bytes, "-", "-"])
        .output()
        .expect("running the child");
    let text = String::from_utf8_lossy(&out.stdout);
    let refused = text.lines().any(|l| l == "R open 400");
    s.say(format!("R reopen_refused {}", u8::from(refused)));
    for &f in &fresh {
        s.free(f);
    }
    for b in bufs {
        s.free(b);
    }
}

/// Opens `h`; the pointer, or `None` after printing the error.
fn open_handle(s: &Session, h: &str) -> Option<CUdeviceptr> {
    let mut p: CUdeviceptr = 0;
    // SAFETY: a valid out-pointer; the handle is bytes the driver (or libtensile) reads.
    let r = unsafe { (s.d.cuIpcOpenMemHandle)(&mut p, unhex(h), 1) };
    s.say(format!("R open {r}"));
    (r == CUDA_SUCCESS).then_some(p)
}

fn close_handle(s: &Session, p: CUdeviceptr) {
    // SAFETY: a pointer cuIpcOpenMemHandle returned.
    let r = unsafe { (s.d.cuIpcCloseMemHandle)(p) };
    s.say(format!("R close {r}"));
}

fn open(s: &Session, h: &str, bytes: usize, expect: &str, write: &str) {
    let Some(p) = open_handle(s, h) else {
        return;
    };
    if let Ok(seed) = expect.parse::<u8>() {
        let ok = s.download(p, bytes, None) == pattern(seed, bytes);
        s.say(format!("C seen {}", if ok { "ok" } else { "bad" }));
    }
    // Opened again: the same pointer, which stays mapped until its last close.
    let mut again: CUdeviceptr = 0;
    // SAFETY: a valid out-pointer; the handle opened above.
    let r = unsafe { (s.d.cuIpcOpenMemHandle)(&mut again, unhex(h), 1) };
    s.say(format!("R open_again {r} {}", u8::from(again == p)));
    close_handle(s, p);
    if let Ok(seed) = write.parse::<u8>() {
        s.upload(p, &pattern(seed, bytes), None);
        s.sync_ctx();
    }
    close_handle(s, p);
}

fn hold(s: &Session, h: &str, bytes: usize) {
    let Some(p) = open_handle(s, h) else {
        return;
    };
    s.say("ready");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    let ok = s.download(p, bytes, None) == pattern(2, bytes);
    s.say(format!("C held {}", if ok { "ok" } else { "bad" }));
    close_handle(s, p);
}

fn foreign(s: &Session) {
    let p = s.alloc(SHARED);
    let mut h = CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: a valid out-pointer and a live allocation.
    let r = unsafe { (s.d.cuIpcGetMemHandle)(&mut h, p) };
    s.say(format!("R get {r}"));
    let mut q: CUdeviceptr = 0;
    // SAFETY: a valid out-pointer; the handle is the driver's.
    let r = unsafe { (s.d.cuIpcOpenMemHandle)(&mut q, h, 1) };
    s.say(format!("R open_own {r}"));
    let garbage = CUipcMemHandle {
        reserved: std::array::from_fn(|i| (i as u8).wrapping_mul(37).wrapping_add(11)),
    };
    // SAFETY: as above; bytes no driver wrote.
    let r = unsafe { (s.d.cuIpcOpenMemHandle)(&mut q, garbage, 1) };
    s.say(format!("R open_garbage {r}"));
    // SAFETY: a pointer nothing opened; the driver reports it.
    let r = unsafe { (s.d.cuIpcCloseMemHandle)(p) };
    s.say(format!("R close_unknown {r}"));
    s.free(p);
}

fn too_large(s: &Session, mib: usize) {
    let bytes = mib * MIB;
    let p = s.alloc(bytes);
    let data = pattern(5, bytes);
    // In pieces of 4 MiB: the whole does not fit the budget under test.
    for (i, piece) in data.chunks(4 * MIB).enumerate() {
        s.upload_at((p + (i * 4 * MIB) as u64, p), piece, None);
    }
    export(s, p);
    let back: Vec<u8> = (0..bytes.div_ceil(4 * MIB))
        .flat_map(|i| {
            let at = i * 4 * MIB;
            s.download(p + at as u64, (bytes - at).min(4 * MIB), None)
        })
        .collect();
    s.say(format!("D after {:016x}", fnv1a(&back)));
    s.say(format!(
        "C after {}",
        if back == data { "ok" } else { "bad" }
    ));
    s.free(p);
}
