//! Traces written by libtensile read back exactly, survive a crash up to the last complete
//! record, and a bad `TENSILE_TRACE` is a clear message, not a failure.

use std::cell::RefCell;
use std::io::Write;
use std::rc::Rc;
use tensile_tests::check::{canonical, compare_in_order, normalize, read_trace};
use tensile_tests::expect::{digests, expectations};
use tensile_tests::harness::{temp_trace, Run};

use tensile_trace::{Reader, Record, TraceError, Writer};

const RAW: &str = env!("CARGO_BIN_EXE_wl_raw");
const STREAMS: &str = env!("CARGO_BIN_EXE_wl_streams");

/// A writer whose bytes stay readable while the trace `Writer` owns it.
#[derive(Clone, Default)]
struct Shared(Rc<RefCell<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Re-encodes `records` (header first) with the trace crate's writer; returns the bytes and
/// the file offset at which each record's frame ends.
fn encode(records: &[Record]) -> (Vec<u8>, Vec<usize>) {
    let Record::Header(h) = &records[0] else {
        panic!("no header")
    };
    let out = Shared::default();
    let mut w = Writer::new(out.clone(), h).unwrap();
    let mut ends = vec![out.0.borrow().len()];
    for r in &records[1..] {
        w.write(r).unwrap();
        ends.push(out.0.borrow().len());
    }
    let bytes = out.0.borrow().clone();
    (bytes, ends)
}

#[test]
fn a_trace_reads_back_and_reencodes_to_the_same_bytes() {
    let path = temp_trace("roundtrip");
    let out = Run::new(STREAMS).arg("proc:13000:2").trace(&path).output();
    out.assert_ok("wl_streams traced");
    let bytes = std::fs::read(&path).unwrap();
    let t = read_trace(&path);
    assert!(t.finished_cleanly && t.error.is_none());
    let (again, ends) = encode(&t.records);
    assert_eq!(again.len(), bytes.len());
    assert!(
        again == bytes,
        "re-encoding the records read back gives different bytes"
    );
    assert_eq!(*ends.last().unwrap(), bytes.len());

    // Cut the file anywhere: every complete record comes back, then Truncated (or a clean
    // end exactly at a frame boundary, which has no End record).
    let mut cuts: Vec<usize> = (0..64).chain((64..bytes.len()).step_by(37)).collect();
    cuts.extend(ends.iter().flat_map(|&e| [e - 1, e, e + 1]));
    cuts.retain(|&c| c < bytes.len());
    for cut in cuts {
        let complete = ends.iter().filter(|&&e| e <= cut).count();
        match Reader::new(&bytes[..cut]) {
            Err(TraceError::NotATrace) => assert!(cut < 8, "cut {cut}"),
            Err(TraceError::Truncated { records_read: 0 }) => assert_eq!(complete, 0, "cut {cut}"),
            Err(e) => panic!("cut {cut}: {e}"),
            Ok(mut reader) => {
                assert!(
                    complete >= 1,
                    "cut {cut}: a header before the header frame ended"
                );
                let got: Vec<Record> = reader.by_ref().map_while(Result::ok).collect();
                assert_eq!(got.as_slice(), &t.records[1..complete], "cut {cut}");
                let at_boundary = ends.contains(&cut);
                let mut r = Reader::new(&bytes[..cut]).unwrap();
                let last = r.by_ref().find(|x| x.is_err());
                match (at_boundary, last) {
                    (true, None) => {}
                    (false, Some(Err(TraceError::Truncated { records_read }))) => {
                        assert_eq!(records_read as usize, complete, "cut {cut}")
                    }
                    (b, other) => panic!("cut {cut} (boundary: {b}): ended with {other:?}"),
                }
            }
        }
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_crashed_program_leaves_every_record_up_to_the_crash() {
    let path = temp_trace("crash");
    let out = Run::new(RAW)
        .args_for_crash()
        .trace(&path)
        .env("WL_RAW_ABORT_AFTER_MS", "400")
        .output();
    assert!(!out.success, "the workload was meant to abort");
    let t = read_trace(&path);
    assert!(
        !t.finished_cleanly,
        "a crashed process cannot have closed its trace"
    );
    assert!(
        matches!(t.error, None | Some(TraceError::Truncated { .. })),
        "{:?}",
        t.error
    );
    let want = canonical(expectations(&out.stdout));
    assert!(want.len() > 30, "only {} expectations", want.len());
    // Everything the program did before it slept was flushed by the writer's timer.
    compare_in_order(&normalize(&t.records), &want).unwrap();
    let _ = std::fs::remove_file(&path);
}

trait CrashArgs {
    fn args_for_crash(self) -> Self;
}

impl CrashArgs for Run {
    fn args_for_crash(self) -> Run {
        self.arg("proc:13000:0").arg("module")
    }
}

#[test]
fn an_unwritable_trace_path_is_reported_and_the_program_still_runs() {
    let plain = Run::new(RAW).arg("proc:13000:0").arg("module").output();
    plain.assert_ok("wl_raw");
    let bad = Run::new(RAW)
        .arg("proc:13000:0")
        .arg("module")
        .preload(true)
        .env("TENSILE_TRACE", "/nonexistent-directory/run.trace")
        .output();
    bad.assert_ok("wl_raw with an unwritable TENSILE_TRACE");
    assert_eq!(digests(&bad.stdout), digests(&plain.stdout));
    assert!(
        bad.stderr.contains("TENSILE_TRACE")
            && bad.stderr.contains("/nonexistent-directory/run.trace")
            && bad.stderr.contains("tracing is off"),
        "no clear message:\n{}",
        bad.stderr
    );
    assert_eq!(
        bad.stderr.lines().count(),
        1,
        "one line, not a flood:\n{}",
        bad.stderr
    );
}

#[test]
fn a_bad_setting_is_one_clear_line_and_the_default() {
    let out = Run::new(RAW)
        .arg("proc:13000:0")
        .arg("module")
        .preload(true)
        .env("TENSILE_POLICY", "fastest")
        .output();
    out.assert_ok("wl_raw with a bad TENSILE_POLICY");
    assert!(
        out.stderr.contains("TENSILE_POLICY=\"fastest\"") && out.stderr.contains("using plan"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_forked_child_leaves_the_parents_trace_alone() {
    let path = temp_trace("fork");
    let out = Run::new(RAW)
        .arg("proc:13000:0")
        .arg("module")
        .env("WL_RAW_FORK", "1")
        .trace(&path)
        .output();
    out.assert_ok("wl_raw forking");
    let t = read_trace(&path);
    assert!(t.finished_cleanly, "{:?}", t.error);
    compare_in_order(
        &normalize(&t.records),
        &canonical(expectations(&out.stdout)),
    )
    .unwrap();
    let _ = std::fs::remove_file(&path);
}

#[test]
fn processes_that_never_use_cuda_are_left_alone() {
    let path = temp_trace("bystander");
    let out = Run::new("/bin/sh")
        .arg("-c")
        .arg("echo hello; ls / > /dev/null")
        .trace(&path)
        .output();
    out.assert_ok("sh under the shim");
    assert_eq!(out.stdout, "hello\n");
    assert_eq!(out.stderr, "");
    assert!(!path.exists(), "a process without CUDA created a trace");
}
