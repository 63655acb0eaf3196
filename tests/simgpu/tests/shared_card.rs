//! Several processes on one simulated card (`TENSILE_SIM_CARD`): they share its capacity and
//! its copy engine, a process that dies gives its memory back, and a card file that is not a
//! card of this version is refused.
//!
//! Each test is a parent that starts copies of this test binary as children (the same test,
//! with `CHILD_ENV` set) and drives them line by line over stdin: every command is answered
//! by one `REPLY ...` line on stdout. Children call the simulator's entry points through the
//! rlib, as a C program would through the cdylib.

use std::ffi::c_void;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cuda::api::context::*;
use cuda::api::copy::*;
use cuda::api::device::*;
use cuda::api::event::*;
use cuda::api::memory::*;
use cuda::shared_card::{self, MAGIC};
use tensile_driver_abi::*;

const CHILD_ENV: &str = "TENSILE_SIMGPU_SHARED_CARD_CHILD";
const MIB: u64 = 1 << 20;
const CAPACITY: u64 = 1 << 30;
/// 60% of `CAPACITY`: two of these cannot both fit.
const SIXTY_PERCENT: u64 = (CAPACITY / 10 * 6) & !(MIB - 1);

/// A card name of its own for each test of this run; the file goes when the test ends.
struct CardFile {
    name: String,
}

impl CardFile {
    fn new(tag: &str) -> Self {
        let name = format!("test-{}-{tag}", std::process::id());
        let _ = std::fs::remove_file(shared_card::path_of(&name));
        Self { name }
    }

    fn path(&self) -> String {
        shared_card::path_of(&self.name)
    }
}

impl Drop for CardFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.path());
        let _ = std::fs::remove_file(shared_card::path_of(&shared_card::device_card_name(
            &self.name, 1,
        )));
    }
}

/// A child process serving commands.
struct Worker {
    process: Child,
    stdin: ChildStdin,
    replies: Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

impl Worker {
    /// Starts this binary's test `test` as a child on `card` (None: a private card) with
    /// `TENSILE_SIM_DEVICE_MEMORY=capacity` and `env`.
    fn start(test: &str, card: Option<&CardFile>, capacity: u64, env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(std::env::current_exe().expect("test binary"));
        command
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .env("TENSILE_SIM_DEVICE_MEMORY", capacity.to_string())
            .env_remove("TENSILE_SIM_CARD")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(card) = card {
            command.env("TENSILE_SIM_CARD", &card.name);
        }
        for (k, v) in env {
            command.env(k, v);
        }
        let mut process = command.spawn().expect("start a child");
        let stdin = process.stdin.take().expect("stdin");
        let stdout = process.stdout.take().expect("stdout");
        let stderr_pipe = process.stderr.take().expect("stderr");
        let (tx, replies) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // The first reply follows libtest's "test NAME ... " on its line.
                if let Some(at) = line.find("REPLY ") {
                    if tx.send(line[at + "REPLY ".len()..].to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr_pipe).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Self {
            process,
            stdin,
            replies,
            stderr,
        }
    }

    fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").expect("write a command");
        self.stdin.flush().expect("flush a command");
    }

    fn reply(&mut self, command: &str) -> String {
        match self.replies.recv_timeout(Duration::from_secs(60)) {
            Ok(r) => r,
            Err(_) => panic!(
                "no reply to {command:?}; the child's stderr:\n{}",
                self.stderr()
            ),
        }
    }

    /// Sends `command` and waits for its reply.
    fn ask(&mut self, command: &str) -> String {
        self.send(command);
        self.reply(command)
    }

    /// Sends `command`, which answers with a result code.
    fn call(&mut self, command: &str) -> CUresult {
        let reply = self.ask(command);
        reply
            .split_whitespace()
            .next()
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("{command:?} answered {reply:?}"))
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// (free, total) as the child's cuMemGetInfo reports them.
    fn mem_info(&mut self) -> (u64, u64) {
        let reply = self.ask("info");
        let v: Vec<u64> = reply
            .split_whitespace()
            .map(|w| w.parse().expect("a number"))
            .collect();
        (v[0], v[1])
    }

    /// Sends SIGKILL (the process may still be dying, and is not reaped, when this returns).
    fn kill(&mut self) {
        self.process.kill().expect("SIGKILL the child");
    }

    /// Reaps a killed child.
    fn reap(mut self) {
        let _ = self.process.wait();
    }

    /// Lets the child exit normally; returns its stderr.
    fn finish(mut self) -> String {
        self.send("exit");
        let status = self.process.wait().expect("wait for the child");
        // The stderr reader ends with the pipe; give it a moment to drain.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && Arc::strong_count(&self.stderr) > 1 {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(status.success(), "child failed:\n{}", self.stderr());
        self.stderr()
    }
}

/// The child's side: runs commands from stdin until `exit` (or the end of stdin).
fn serve() {
    let mut allocations: Vec<CUdeviceptr> = Vec::new();
    // (pinned host buffer, device buffer, bytes) of an upload.
    let mut upload: Option<(*mut u8, CUdeviceptr, usize)> = None;
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("read a command");
        let words: Vec<&str> = line.split_whitespace().collect();
        let arg = |i: usize| -> u64 { words[i].parse().expect("a number") };
        // SAFETY: plain driver calls with valid out-pointers; host buffers hold what is
        // copied (each is allocated with the size used).
        let reply = unsafe {
            match words[0] {
                "init" => {
                    let mut rc = cuInit(0);
                    if rc == CUDA_SUCCESS {
                        let mut ctx = std::ptr::null_mut();
                        rc = cuCtxCreate_v2(&mut ctx, 0, 0);
                    }
                    rc.to_string()
                }
                // A new context on device arg(1), current from now on.
                "ctx" => {
                    let mut ctx = std::ptr::null_mut();
                    cuCtxCreate_v2(&mut ctx, 0, arg(1) as CUdevice).to_string()
                }
                "alloc" => {
                    let mut p = 0;
                    let rc = cuMemAlloc_v2(&mut p, arg(1) as usize);
                    if rc == CUDA_SUCCESS {
                        allocations.push(p);
                    }
                    rc.to_string()
                }
                // Retries for up to arg(2) ms; answers the code and the milliseconds taken.
                "alloc_within" => {
                    let start = Instant::now();
                    loop {
                        let mut p = 0;
                        let rc = cuMemAlloc_v2(&mut p, arg(1) as usize);
                        if rc == CUDA_SUCCESS {
                            allocations.push(p);
                        }
                        let ms = start.elapsed().as_millis();
                        if rc == CUDA_SUCCESS || ms >= arg(2) as u128 {
                            break format!("{rc} {ms}");
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                "free_all" => {
                    let mut rc = CUDA_SUCCESS;
                    for p in allocations.drain(..) {
                        let r = cuMemFree_v2(p);
                        if rc == CUDA_SUCCESS {
                            rc = r;
                        }
                    }
                    rc.to_string()
                }
                "info" => {
                    let (mut free, mut total) = (0, 0);
                    let rc = cuMemGetInfo_v2(&mut free, &mut total);
                    assert_eq!(rc, CUDA_SUCCESS, "cuMemGetInfo");
                    let mut device_total = 0;
                    let rc = cuDeviceTotalMem_v2(&mut device_total, 0);
                    assert_eq!(rc, CUDA_SUCCESS, "cuDeviceTotalMem");
                    assert_eq!(device_total, total, "cuDeviceTotalMem and cuMemGetInfo");
                    format!("{free} {total}")
                }
                // Allocates arg(1) bytes of pinned host memory (filled with a pattern seeded
                // by arg(2)) and of device memory, for `upload`.
                "prepare_upload" => {
                    let bytes = arg(1) as usize;
                    let mut host = std::ptr::null_mut();
                    let mut rc = cuMemAllocHost_v2(&mut host, bytes);
                    let mut dev = 0;
                    if rc == CUDA_SUCCESS {
                        rc = cuMemAlloc_v2(&mut dev, bytes);
                    }
                    if rc == CUDA_SUCCESS {
                        let words = std::slice::from_raw_parts_mut(host as *mut u64, bytes / 8);
                        for (i, w) in words.iter_mut().enumerate() {
                            *w = pattern(arg(2), i as u64);
                        }
                        upload = Some((host as *mut u8, dev, bytes));
                    }
                    rc.to_string()
                }
                // Copies the prepared buffer to the device; answers the code and when the
                // copy was queued and when it ended on the card (its modelled end, from event
                // timing, so the host's own work after it does not count), CLOCK_MONOTONIC ns.
                "upload" => {
                    let (host, dev, bytes) = upload.expect("prepare_upload first");
                    let (mut before, mut after) = (std::ptr::null_mut(), std::ptr::null_mut());
                    let mut rc = cuEventCreate(&mut before, 0);
                    if rc == CUDA_SUCCESS {
                        rc = cuEventCreate(&mut after, 0);
                    }
                    let queued = cuda::card::now_ns();
                    let null = std::ptr::null_mut();
                    if rc == CUDA_SUCCESS {
                        rc = cuEventRecord(before, null);
                    }
                    if rc == CUDA_SUCCESS {
                        rc = cuMemcpyHtoDAsync_v2(dev, host as *const c_void, bytes, null);
                    }
                    if rc == CUDA_SUCCESS {
                        rc = cuEventRecord(after, null);
                    }
                    if rc == CUDA_SUCCESS {
                        rc = cuEventSynchronize(after);
                    }
                    let mut ms = 0f32;
                    if rc == CUDA_SUCCESS {
                        rc = cuEventElapsedTime(&mut ms, before, after);
                    }
                    let end = queued + (ms as f64 * 1e6) as u64;
                    format!("{rc} {queued} {end}")
                }
                // Reads the uploaded bytes back and compares them with the pattern.
                "verify_upload" => {
                    let (_, dev, bytes) = upload.expect("prepare_upload first");
                    let mut back = vec![0u64; bytes / 8];
                    let rc = cuMemcpyDtoH_v2(back.as_mut_ptr() as *mut c_void, dev, bytes);
                    let wrong = back
                        .iter()
                        .enumerate()
                        .position(|(i, &w)| w != pattern(arg(1), i as u64));
                    match wrong {
                        None => rc.to_string(),
                        Some(i) => format!("{rc} word {i} differs"),
                    }
                }
                "hang_holding_lock" => {
                    println!("REPLY 0");
                    std::io::stdout().flush().unwrap();
                    shared_card::current(0)
                        .expect("a shared card")
                        .hang_holding_lock()
                }
                "exit" => return,
                other => panic!("unknown command {other:?}"),
            }
        };
        println!("REPLY {reply}");
        std::io::stdout().flush().unwrap();
    }
}

fn pattern(seed: u64, i: u64) -> u64 {
    (seed ^ i)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .rotate_left(17)
}

/// In a child, serves commands and returns true; in the parent, false.
fn is_child() -> bool {
    if std::env::var_os(CHILD_ENV).is_some() {
        serve();
        true
    } else {
        false
    }
}

#[test]
fn two_processes_cannot_both_hold_sixty_percent_until_one_exits() {
    if is_child() {
        return;
    }
    let test = "two_processes_cannot_both_hold_sixty_percent_until_one_exits";
    let card = CardFile::new("sixty");
    let mut a = Worker::start(test, Some(&card), CAPACITY, &[]);
    let mut b = Worker::start(test, Some(&card), CAPACITY, &[]);
    assert_eq!(a.call("init"), CUDA_SUCCESS, "{}", a.stderr());
    assert_eq!(b.call("init"), CUDA_SUCCESS, "{}", b.stderr());

    let mode = std::fs::metadata(card.path())
        .expect("the card file")
        .mode_bits();
    assert_eq!(mode & 0o777, 0o600, "the card file is private");

    assert_eq!(a.call(&format!("alloc {SIXTY_PERCENT}")), CUDA_SUCCESS);
    assert_eq!(
        b.mem_info(),
        (CAPACITY - SIXTY_PERCENT, CAPACITY),
        "the other process sees the card's free memory"
    );
    assert_eq!(
        b.call(&format!("alloc {SIXTY_PERCENT}")),
        CUDA_ERROR_OUT_OF_MEMORY,
        "the second 60% does not fit on the card"
    );
    // What is left still fits.
    assert_eq!(b.call(&format!("alloc {}", 100 * MIB)), CUDA_SUCCESS);
    assert_eq!(b.call("free_all"), CUDA_SUCCESS);

    // A free in one process shows in the other at once.
    assert_eq!(a.call("free_all"), CUDA_SUCCESS);
    assert_eq!(b.mem_info(), (CAPACITY, CAPACITY));
    assert_eq!(a.call(&format!("alloc {SIXTY_PERCENT}")), CUDA_SUCCESS);

    // A process that exits gives back what it held.
    let a_err = a.finish();
    assert!(a_err.is_empty(), "nothing on stderr: {a_err}");
    assert_eq!(b.call(&format!("alloc {SIXTY_PERCENT}")), CUDA_SUCCESS);
    assert_eq!(b.mem_info().0, CAPACITY - SIXTY_PERCENT);
    b.finish();
}

trait ModeBits {
    fn mode_bits(&self) -> u32;
}

impl ModeBits for std::fs::Metadata {
    fn mode_bits(&self) -> u32 {
        use std::os::unix::fs::MetadataExt;
        self.mode()
    }
}

#[test]
fn memory_of_a_killed_process_returns_within_a_second() {
    if is_child() {
        return;
    }
    let test = "memory_of_a_killed_process_returns_within_a_second";
    let card = CardFile::new("killed");
    let mut a = Worker::start(test, Some(&card), CAPACITY, &[]);
    let mut b = Worker::start(test, Some(&card), CAPACITY, &[]);
    assert_eq!(a.call("init"), CUDA_SUCCESS, "{}", a.stderr());
    assert_eq!(b.call("init"), CUDA_SUCCESS, "{}", b.stderr());
    assert_eq!(a.call(&format!("alloc {SIXTY_PERCENT}")), CUDA_SUCCESS);
    assert_eq!(
        b.call(&format!("alloc {SIXTY_PERCENT}")),
        CUDA_ERROR_OUT_OF_MEMORY
    );
    // Not reaped: a zombie holds its pid until then, and counts as gone all the same.
    a.kill();
    let reply = b.ask(&format!("alloc_within {SIXTY_PERCENT} 1000"));
    let (rc, ms) = reply.split_once(' ').expect("code and time");
    assert_eq!(
        rc.parse::<CUresult>().unwrap(),
        CUDA_SUCCESS,
        "the killed process's 60% came back within a second (after {ms} ms)"
    );
    a.reap();

    // The same when the killed process was the card's last: the next one finds it stale.
    b.kill();
    b.reap();
    let mut c = Worker::start(test, Some(&card), CAPACITY, &[]);
    assert_eq!(c.call("init"), CUDA_SUCCESS, "{}", c.stderr());
    assert_eq!(c.mem_info(), (CAPACITY, CAPACITY));
    assert_eq!(c.call(&format!("alloc {SIXTY_PERCENT}")), CUDA_SUCCESS);
    let err = c.finish();
    assert!(err.is_empty(), "nothing on stderr: {err}");
}

#[test]
fn a_process_killed_holding_the_cards_lock_does_not_stop_the_others() {
    if is_child() {
        return;
    }
    let test = "a_process_killed_holding_the_cards_lock_does_not_stop_the_others";
    let card = CardFile::new("lock");
    let mut a = Worker::start(test, Some(&card), CAPACITY, &[]);
    let mut b = Worker::start(test, Some(&card), CAPACITY, &[]);
    assert_eq!(a.call("init"), CUDA_SUCCESS, "{}", a.stderr());
    assert_eq!(b.call("init"), CUDA_SUCCESS, "{}", b.stderr());
    assert_eq!(a.call(&format!("alloc {SIXTY_PERCENT}")), CUDA_SUCCESS);
    assert_eq!(a.call("hang_holding_lock"), CUDA_SUCCESS);
    // B blocks on the lock A holds until A dies.
    b.send(&format!("alloc_within {SIXTY_PERCENT} 1000"));
    std::thread::sleep(Duration::from_millis(200));
    a.kill();
    let reply = b.reply("alloc_within");
    let (rc, ms) = reply.split_once(' ').expect("code and time");
    assert_eq!(
        rc.parse::<CUresult>().unwrap(),
        CUDA_SUCCESS,
        "the card works again after its lock's holder died ({ms} ms); stderr:\n{}",
        b.stderr()
    );
    a.reap();
    assert_eq!(b.mem_info().0, CAPACITY - SIXTY_PERCENT);
    let err = b.finish();
    assert_eq!(
        err.lines().count(),
        1,
        "one line about the dead holder: {err}"
    );
    assert!(err.contains("died holding"), "{err}");
}

#[test]
fn processes_starting_at_once_all_join_one_card() {
    if is_child() {
        return;
    }
    let test = "processes_starting_at_once_all_join_one_card";
    let card = CardFile::new("race");
    let mut workers: Vec<Worker> = (0..6)
        .map(|_| Worker::start(test, Some(&card), CAPACITY, &[]))
        .collect();
    // All open the card at once: whoever creates it, the others wait for it to be ready.
    for w in workers.iter_mut() {
        w.send("init");
    }
    for w in workers.iter_mut() {
        let rc: CUresult = w.reply("init").parse().unwrap();
        assert_eq!(rc, CUDA_SUCCESS, "{}", w.stderr());
    }
    let tenth = (CAPACITY / 10) & !(MIB - 1);
    for w in workers.iter_mut() {
        assert_eq!(w.call(&format!("alloc {tenth}")), CUDA_SUCCESS);
    }
    for w in workers.iter_mut() {
        assert_eq!(w.mem_info(), (CAPACITY - 6 * tenth, CAPACITY), "one card");
    }
    for w in workers {
        let err = w.finish();
        assert!(err.is_empty(), "nothing on stderr: {err}");
    }
}

#[test]
fn each_device_of_a_shared_card_is_a_card_of_its_own() {
    if is_child() {
        return;
    }
    let test = "each_device_of_a_shared_card_is_a_card_of_its_own";
    let card = CardFile::new("devices");
    let env = [("TENSILE_SIM_DEVICE_COUNT", "2")];
    let mut a = Worker::start(test, Some(&card), CAPACITY, &env);
    let mut b = Worker::start(test, Some(&card), CAPACITY, &env);
    // A process with one device shares device 0 only.
    let mut c = Worker::start(test, Some(&card), CAPACITY, &[]);
    for w in [&mut a, &mut b, &mut c] {
        assert_eq!(w.call("init"), CUDA_SUCCESS, "{}", w.stderr());
    }
    let device1 = shared_card::path_of(&shared_card::device_card_name(&card.name, 1));
    assert!(
        std::path::Path::new(&device1).exists(),
        "device 1's card is {device1}"
    );
    assert_eq!(a.call("ctx 1"), CUDA_SUCCESS);
    assert_eq!(a.call(&format!("alloc {SIXTY_PERCENT}")), CUDA_SUCCESS);
    // B: device 0 is free, device 1 is A's.
    assert_eq!(b.call(&format!("alloc {SIXTY_PERCENT}")), CUDA_SUCCESS);
    assert_eq!(b.call("ctx 1"), CUDA_SUCCESS);
    assert_eq!(b.mem_info(), (CAPACITY - SIXTY_PERCENT, CAPACITY));
    assert_eq!(
        b.call(&format!("alloc {SIXTY_PERCENT}")),
        CUDA_ERROR_OUT_OF_MEMORY
    );
    // C sees B's 60% on device 0, and has no device 1.
    assert_eq!(c.mem_info(), (CAPACITY - SIXTY_PERCENT, CAPACITY));
    assert_eq!(c.call("ctx 1"), CUDA_ERROR_INVALID_DEVICE);
    for w in [a, b, c] {
        let err = w.finish();
        assert!(err.is_empty(), "nothing on stderr: {err}");
    }
}

#[test]
fn a_joiner_with_another_capacity_uses_the_cards_and_says_so_once() {
    if is_child() {
        return;
    }
    let test = "a_joiner_with_another_capacity_uses_the_cards_and_says_so_once";
    let card = CardFile::new("capacity");
    let mut a = Worker::start(test, Some(&card), CAPACITY, &[]);
    assert_eq!(a.call("init"), CUDA_SUCCESS, "{}", a.stderr());
    let mut b = Worker::start(test, Some(&card), 2 * CAPACITY, &[]);
    assert_eq!(b.call("init"), CUDA_SUCCESS, "{}", b.stderr());
    assert_eq!(b.mem_info(), (CAPACITY, CAPACITY));
    assert_eq!(
        b.call(&format!("alloc {}", CAPACITY + MIB)),
        CUDA_ERROR_OUT_OF_MEMORY,
        "the card's capacity applies, not the joiner's"
    );
    let err = b.finish();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&card.path()) && err.contains("using the card's"),
        "{err}"
    );
    assert!(a.finish().is_empty());
}

#[test]
fn a_card_file_that_is_not_a_card_of_this_version_is_refused_in_one_line() {
    if is_child() {
        return;
    }
    let test = "a_card_file_that_is_not_a_card_of_this_version_is_refused_in_one_line";
    use std::os::unix::fs::OpenOptionsExt;
    let write = |path: &str, bytes: &[u8]| {
        let _ = std::fs::remove_file(path);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .unwrap();
        f.write_all(bytes).unwrap();
    };
    let card = CardFile::new("refused");

    let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    let mut other_version = MAGIC.to_le_bytes().to_vec();
    other_version.extend_from_slice(&99u32.to_le_bytes());
    other_version.extend_from_slice(&4096u32.to_le_bytes());
    other_version.resize(4096, 0);
    for (contents, says) in [
        (garbage, "not a simulated card"),
        (other_version, "version 99"),
    ] {
        write(&card.path(), &contents);
        let mut a = Worker::start(test, Some(&card), CAPACITY, &[]);
        assert_eq!(a.call("init"), CUDA_ERROR_NO_DEVICE, "refused: {says}");
        let err = a.finish();
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.contains(&card.path()) && err.contains(says), "{err}");
        assert_eq!(
            std::fs::read(card.path()).unwrap(),
            contents,
            "a refused file is left as it was"
        );
    }

    // A file whose creator died before it wrote the magic (zeros) is initialised afresh.
    write(&card.path(), &[0; 100]);
    let mut a = Worker::start(test, Some(&card), CAPACITY, &[]);
    assert_eq!(a.call("init"), CUDA_SUCCESS, "{}", a.stderr());
    assert_eq!(a.mem_info(), (CAPACITY, CAPACITY));
    assert!(a.finish().is_empty());

    // A card of this version cut short is refused too (mapping it would fault past its end).
    let whole = std::fs::read(card.path()).unwrap();
    write(&card.path(), &whole[..64]);
    let mut a = Worker::start(test, Some(&card), CAPACITY, &[]);
    assert_eq!(a.call("init"), CUDA_ERROR_NO_DEVICE, "a truncated card");
    let err = a.finish();
    assert!(
        err.lines().count() == 1 && err.contains("it is 64 bytes"),
        "{err}"
    );
    write(&card.path(), &whole);

    // A card others may read, or (when this runs as root, which may hand it over) another
    // user's, is refused too.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(card.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut a = Worker::start(test, Some(&card), CAPACITY, &[]);
    assert_eq!(
        a.call("init"),
        CUDA_ERROR_NO_DEVICE,
        "a card open to others"
    );
    let err = a.finish();
    assert!(
        err.lines().count() == 1 && err.contains("mode is 644"),
        "{err}"
    );
    std::fs::set_permissions(card.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(card.path(), Some(65534), None).unwrap();
        let mut a = Worker::start(test, Some(&card), CAPACITY, &[]);
        assert_eq!(a.call("init"), CUDA_ERROR_NO_DEVICE, "another user's card");
        let err = a.finish();
        assert!(
            err.lines().count() == 1 && err.contains("belongs to uid 65534"),
            "{err}"
        );
    }
}

/// Each copy's engine time: the modelled `copy_ns` that ends when the card says it ended.
fn engine_overlap_ns(a: (u64, u64), b: (u64, u64), copy_ns: u64) -> u64 {
    let (a0, a1) = (a.1.saturating_sub(copy_ns), a.1);
    let (b0, b1) = (b.1.saturating_sub(copy_ns), b.1);
    a1.min(b1).saturating_sub(a0.max(b0))
}

#[test]
fn two_processes_copying_at_once_take_turns_on_the_cards_copy_engine() {
    if is_child() {
        return;
    }
    let test = "two_processes_copying_at_once_take_turns_on_the_cards_copy_engine";
    const BYTES: u64 = 256 * MIB;
    const GBPS: f64 = 0.5;
    let copy_ns = (BYTES as f64 / (GBPS * 1e9) * 1e9) as u64;
    let env = [("TENSILE_SIM_H2D_GBPS", "0.5")];
    let card = CardFile::new("engines");
    // (each copy's start and end, the two copies' span)
    let run = |card: Option<&CardFile>| {
        let mut workers: Vec<Worker> = (0..2)
            .map(|_| Worker::start(test, card, 16 << 30, &env))
            .collect();
        for (seed, w) in workers.iter_mut().enumerate() {
            assert_eq!(w.call("init"), CUDA_SUCCESS, "{}", w.stderr());
            assert_eq!(
                w.call(&format!("prepare_upload {BYTES} {seed}")),
                CUDA_SUCCESS
            );
        }
        for w in workers.iter_mut() {
            w.send("upload");
        }
        let times: Vec<(u64, u64)> = workers
            .iter_mut()
            .map(|w| {
                let reply = w.reply("upload");
                let v: Vec<u64> = reply
                    .split_whitespace()
                    .map(|x| x.parse().unwrap())
                    .collect();
                assert_eq!(v[0], CUDA_SUCCESS as u64, "upload");
                (v[1], v[2])
            })
            .collect();
        for (seed, w) in workers.iter_mut().enumerate() {
            assert_eq!(w.ask(&format!("verify_upload {seed}")), "0", "data");
        }
        for w in workers {
            w.finish();
        }
        let span = times[0].1.max(times[1].1) - times[0].0.min(times[1].0);
        (times, span)
    };
    let (shared, shared_span) = run(Some(&card));
    let (private, private_span) = run(None);
    let shared_overlap = engine_overlap_ns(shared[0], shared[1], copy_ns);
    let private_overlap = engine_overlap_ns(private[0], private[1], copy_ns);
    let ms = |ns: u64| ns as f64 / 1e6;
    println!(
        "one copy {:.0} ms; shared card: span {:.0} ms, overlap {:.0} ms; private cards: span \
         {:.0} ms, overlap {:.0} ms",
        ms(copy_ns),
        ms(shared_span),
        ms(shared_overlap),
        ms(private_span),
        ms(private_overlap)
    );
    assert!(
        shared_overlap * 10 <= copy_ns * 3,
        "on one card the copies overlap at most 30% of one copy: {:.0} ms of {:.0} ms",
        ms(shared_overlap),
        ms(copy_ns)
    );
    assert!(
        shared_span * 10 >= copy_ns * 17,
        "two copies on one card take about twice one: {:.0} ms for {:.0} ms each",
        ms(shared_span),
        ms(copy_ns)
    );
    // The control: on cards of their own, the same copies run side by side.
    assert!(
        private_overlap * 2 >= copy_ns,
        "on private cards the copies overlap: {:.0} ms of {:.0} ms",
        ms(private_overlap),
        ms(copy_ns)
    );
}
