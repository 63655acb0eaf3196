//! `trace-info` on both formats, cut files, and its timeline checked against the Chrome
//! trace-event format.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tensile_trace::*;

use super::{render, TraceInfoArgs};

fn shared_capture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../analyzer/tests/data/mlp.trace.gz")
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("trace-info-{}-{name}", std::process::id()))
}

fn args(trace: &Path, timeline: Option<&Path>) -> TraceInfoArgs {
    TraceInfoArgs {
        trace: trace.to_path_buf(),
        top: 5,
        timeline: timeline.map(Path::to_path_buf),
    }
}

/// A small native trace: two streams, timed and untimed launches, a copy, a sync, and the
/// swap statistics; gzipped, with `syncs` extra sync records to make it long.
fn native_trace(syncs: u64) -> Vec<u8> {
    let header = Header {
        format_version: FORMAT_VERSION,
        pid: 42,
        start_unix_ns: 0,
        producer: "test".into(),
        command: "train".into(),
    };
    let mut w = Writer::new(Vec::new(), &header).unwrap();
    let launch = |t_ns, stream, seq, alloc| {
        Record::Launch(Launch {
            t_ns,
            stream,
            seq,
            kernel: 1,
            grid: [1; 3],
            block: [1; 3],
            smem: 0,
            accesses: vec![Access {
                alloc,
                param_offset: 0,
            }],
        })
    };
    let mut records = vec![
        Record::Kernel(KernelInfo {
            id: 1,
            name: "gemm_kernel".into(),
            nparams: 3,
        }),
        Record::Alloc(Alloc {
            t_ns: 10,
            stream: 0,
            id: 1,
            ptr: 1 << 30,
            bytes: 4 << 20,
            kind: AllocKind::Sync,
        }),
        Record::Copy(Copy {
            t_ns: 20,
            stream: 7,
            kind: CopyKind::HostToDevice,
            dst: 1,
            src: 0,
            bytes: 4 << 20,
            asynchronous: true,
        }),
        launch(30, 7, 0, 1),
        launch(31, 7, 1, 1),
        launch(40, 9, 2, 1),
        Record::LaunchTime(LaunchTime {
            seq: 0,
            gpu_ns: 500_000,
        }),
        Record::LaunchTime(LaunchTime {
            seq: 2,
            gpu_ns: 200_000,
        }),
        Record::Swap(Swap {
            t_ns: 50_000,
            dir: SwapDir::ToHost,
            cause: SwapCause::Reserve,
            pages: 3,
            bytes: 6 << 20,
            runs: Vec::new(),
        }),
        Record::Busy(Busy {
            t_ns: 60_000,
            dur_ns: 40_000,
            kind: BusyKind::RemapOut,
            thread: 77,
            pages: 3,
        }),
        Record::Swap(Swap {
            t_ns: 100_000,
            dir: SwapDir::ToDevice,
            cause: SwapCause::Access,
            pages: 4,
            bytes: 8 << 20,
            runs: vec![(0x7f00_0000_0000, 1), (0x7f00_0060_0000, 3)],
        }),
        Record::Busy(Busy {
            t_ns: 90_000,
            dur_ns: 1_500_000,
            kind: BusyKind::Stall,
            thread: 78,
            pages: 4,
        }),
        Record::Plan(PlanChange {
            t_ns: 1_000_000,
            version: 3,
            launches: 2,
            change: PlanChangeKind::Dropped {
                reason: "at launch 2 (position 0 of 2): expected kernel `a`, got `b`".into(),
            },
        }),
        Record::Free(Free {
            t_ns: 2_000_000,
            stream: 0,
            id: 1,
        }),
        Record::Stats(Stats {
            bytes_to_host: 6 << 20,
            bytes_to_device: 8 << 20,
            stalled_launches: 3,
            stall_ns: 1_500_000,
            peak_resident_bytes: 4 << 20,
            host_pool_bytes: 64 << 20,
        }),
    ];
    records.extend((0..syncs).map(|i| {
        Record::Sync(Sync {
            t_ns: 2_000_001 + i,
            scope: SyncScope::Context,
        })
    }));
    for r in &records {
        w.write(r).unwrap();
    }
    let bytes = w
        .finish(End {
            t_ns: 3_000_000,
            dropped_records: 0,
        })
        .unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none());
    gz.write_all(&bytes).unwrap();
    gz.finish().unwrap()
}

#[test]
fn reads_a_capture_file_it_used_to_call_foreign() {
    let out = render(&args(&shared_capture(), None)).unwrap();
    assert!(out.contains("format:   capture v1"), "{out}");
    assert!(out.contains("launches: "), "{out}");
    assert!(out.contains("top kernels by GPU time"), "{out}");
    assert!(out.contains("swap statistics: none"), "{out}");
    assert!(!out.contains("bad magic"), "{out}");
}

#[test]
fn native_trace_shows_its_detail_and_swap_statistics() {
    let path = temp("native.trace.gz");
    std::fs::write(&path, native_trace(0)).unwrap();
    let out = render(&args(&path, None)).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(out.contains("format:   tensile"), "{out}");
    assert!(out.contains("producer: test  pid 42"), "{out}");
    assert!(out.contains("launches: 3 on 3 streams"), "{out}");
    assert!(
        out.contains("swap statistics: to host 6.00 MiB, to device 8.00 MiB; 3 launches stalled"),
        "{out}"
    );
    assert!(
        !out.contains("state:"),
        "a complete trace has no state line:\n{out}"
    );
    assert!(
        out.contains(
            "library swaps out: 1 copies, 3 pages, 6.00 MiB copied; pages by cause: for the \
             free reserve 3 (6.00 MiB)"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "library swaps in: 1 copies, 4 pages, 8.00 MiB copied; pages by cause: on demand 4"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "library host time: remaps out 1 for 0.040 ms; stalled accesses 1 for 1.500 ms"
        ),
        "{out}"
    );
    assert!(
        out.contains("plan 3 dropped at launch 2 (position 0 of 2)"),
        "{out}"
    );
}

#[test]
fn a_cut_gzipped_native_trace_is_summarized_up_to_the_cut() {
    let gz = native_trace(5000);
    let path = temp("cut.trace.gz");
    std::fs::write(&path, &gz[..gz.len() / 2]).unwrap();
    let out = render(&args(&path, None)).unwrap();
    std::fs::remove_file(&path).unwrap();
    let state = out
        .lines()
        .find(|l| l.starts_with("state:"))
        .unwrap_or_else(|| panic!("no state line:\n{out}"));
    let kept: u64 = state
        .split("truncated after ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no record count in {state:?}"));
    assert!(kept > 1000, "{state}");
}

#[test]
fn a_cut_capture_file_is_summarized_up_to_the_cut() {
    let gz = std::fs::read(shared_capture()).unwrap();
    let path = temp("cut-capture.trace.gz");
    std::fs::write(&path, &gz[..gz.len() / 2]).unwrap();
    let out = render(&args(&path, None)).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(out.contains("state:    truncated at line "), "{out}");
    assert!(out.contains("summarized up to the cut"), "{out}");
}

#[test]
fn a_foreign_file_is_refused_by_name() {
    let path = temp("foreign.txt");
    std::fs::write(&path, "hello\n").unwrap();
    let err = render(&args(&path, None)).expect_err("a foreign file is refused");
    std::fs::remove_file(&path).unwrap();
    assert!(err.contains("is not a trace"), "{err}");
    std::fs::write(&path, "").unwrap();
    let err = render(&args(&path, None)).expect_err("an empty file is refused");
    std::fs::remove_file(&path).unwrap();
    assert!(
        err.ends_with("it starts with nothing (the file is empty)"),
        "{err}"
    );
}

/// Checks a document against the Chrome trace-event format as this project writes it;
/// returns the events by phase.
fn check_chrome_trace(doc: &Value) -> HashMap<String, Vec<Value>> {
    let events = doc["traceEvents"]
        .as_array()
        .expect("traceEvents is an array");
    let mut by_phase: HashMap<String, Vec<Value>> = HashMap::new();
    let mut last_ts: HashMap<(u64, String), f64> = HashMap::new();
    for e in events {
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("no ph: {e}"));
        let pid = e["pid"].as_u64().unwrap_or_else(|| panic!("no pid: {e}"));
        assert!(e["tid"].is_u64(), "no tid: {e}");
        let ts = e["ts"].as_f64().unwrap_or_else(|| panic!("no ts: {e}"));
        assert!(ts >= 0.0, "negative ts: {e}");
        let name = e["name"].as_str().unwrap_or_else(|| panic!("no name: {e}"));
        assert!(!name.is_empty(), "empty name: {e}");
        let track = match ph {
            "X" => {
                let dur = e["dur"]
                    .as_f64()
                    .unwrap_or_else(|| panic!("X without dur: {e}"));
                assert!(dur >= 0.0, "negative dur: {e}");
                Some(format!("thread {}", e["tid"]))
            }
            "i" => {
                let s = e["s"]
                    .as_str()
                    .unwrap_or_else(|| panic!("i without s: {e}"));
                assert!(["t", "p", "g"].contains(&s), "bad scope: {e}");
                Some(format!("thread {}", e["tid"]))
            }
            "C" => {
                let args = e["args"]
                    .as_object()
                    .unwrap_or_else(|| panic!("C without args: {e}"));
                assert!(
                    !args.is_empty() && args.values().all(Value::is_number),
                    "{e}"
                );
                Some(format!("counter {name}"))
            }
            "M" => {
                assert!(
                    ["process_name", "thread_name", "thread_sort_index"].contains(&name),
                    "unknown metadata: {e}"
                );
                assert!(e["args"].is_object(), "M without args: {e}");
                None
            }
            other => panic!("phase {other} is not one this project writes: {e}"),
        };
        if let Some(track) = track {
            let last = last_ts.entry((pid, track)).or_insert(0.0);
            assert!(ts >= *last, "ts goes back on its track: {e}");
            *last = ts;
        }
        by_phase.entry(ph.to_string()).or_default().push(e.clone());
    }
    by_phase
}

fn timeline_of(trace: &Path, name: &str) -> (String, HashMap<String, Vec<Value>>) {
    let out_path = temp(name);
    let out = render(&args(trace, Some(&out_path))).unwrap();
    let text = std::fs::read_to_string(&out_path).unwrap();
    std::fs::remove_file(&out_path).unwrap();
    let doc: Value = serde_json::from_str(&text).expect("the timeline is JSON");
    (out, check_chrome_trace(&doc))
}

#[test]
fn capture_timeline_follows_the_format_with_kernels_per_stream() {
    let (out, events) = timeline_of(&shared_capture(), "capture-timeline.json");
    assert!(out.contains("timeline: "), "{out}");
    let kernels = events["X"].iter().filter(|e| e["cat"] == "kernel").count();
    assert!(kernels > 100, "only {kernels} timed kernels");
    assert!(events["C"].iter().any(|e| e["name"] == "bytes allocated"));
    let threads: Vec<&str> = events["M"]
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    assert!(
        threads.iter().any(|t| t.starts_with("stream ")),
        "{threads:?}"
    );
}

#[test]
fn native_timeline_places_ops_in_stream_order_and_carries_the_swap_totals() {
    let path = temp("native-timeline.trace.gz");
    std::fs::write(&path, native_trace(0)).unwrap();
    let (_, events) = timeline_of(&path, "native-timeline.json");
    std::fs::remove_file(&path).unwrap();
    let x = &events["X"];
    // Stream 7: the copy (4 MiB at 55 GB/s = 76.3 us from t = 0.02 us), then the timed kernel
    // after it; stream 9's kernel at its own call time.
    let copy = x.iter().find(|e| e["cat"] == "copy").expect("a copy span");
    assert!(
        copy["args"].get("launch_seq").is_none(),
        "a copy is no launch"
    );
    let kernel7 = x
        .iter()
        .find(|e| e["cat"] == "kernel" && e["args"]["launch_seq"] == 0)
        .expect("launch 0");
    let copy_end = copy["ts"].as_f64().unwrap() + copy["dur"].as_f64().unwrap();
    assert!(
        (copy["dur"].as_f64().unwrap() - 76.26).abs() < 0.01,
        "{copy}"
    );
    assert_eq!(kernel7["ts"].as_f64().unwrap(), copy_end);
    assert_eq!(kernel7["dur"], 500.0);
    assert_eq!(kernel7["name"], "gemm_kernel");
    let kernel9 = x
        .iter()
        .find(|e| e["args"]["launch_seq"] == 2)
        .expect("launch 2");
    assert_eq!(kernel9["ts"], 0.04);
    assert_ne!(kernel9["tid"], kernel7["tid"], "two streams, two tracks");
    // The untimed launch is an instant after launch 0 ends, not a made-up span.
    let untimed = events["i"]
        .iter()
        .find(|e| e["args"]["launch_seq"] == 1)
        .expect("launch 1 as an instant");
    assert_eq!(untimed["ts"].as_f64().unwrap(), copy_end + 500.0);
    let swap = events["i"]
        .iter()
        .find(|e| e["name"] == "swap statistics (process totals at exit)")
        .expect("the swap statistics");
    assert_eq!(swap["args"]["bytes_to_device"], 8 << 20);
    assert_eq!(swap["args"]["stalled_launches"], 3);
    // The library's own work: each copy queued at its host time on its direction's track,
    // each span of host time as measured on its thread's track, the plan's drop.
    let queued: Vec<&Value> = events["i"].iter().filter(|e| e["cat"] == "swap").collect();
    let out = queued
        .iter()
        .find(|e| e["name"] == "out 3 pages (for the free reserve)")
        .expect("the swap-out");
    let inn = queued
        .iter()
        .find(|e| e["name"] == "in 4 pages (on demand)")
        .expect("the swap-in");
    assert_eq!(
        (out["ts"].as_f64(), inn["ts"].as_f64()),
        (Some(50.0), Some(100.0))
    );
    assert_ne!(out["tid"], inn["tid"]);
    assert_eq!(inn["args"]["bytes"], 8 << 20);
    assert_eq!(
        inn["args"]["at"],
        json!([["0x7f0000000000", 1], ["0x7f0000600000", 3]])
    );
    assert_eq!(
        out["args"]["at"],
        json!([]),
        "a format 2 swap names no pages"
    );
    let stall = x
        .iter()
        .find(|e| e["name"] == "stalled accesses")
        .expect("the stall");
    assert_eq!(
        (stall["ts"].as_f64(), stall["dur"].as_f64()),
        (Some(90.0), Some(1500.0))
    );
    let remap = x
        .iter()
        .find(|e| e["name"] == "remaps out")
        .expect("the remap");
    assert_ne!(remap["tid"], stall["tid"], "two threads, two tracks");
    assert!(events["i"]
        .iter()
        .any(|e| e["cat"] == "plan" && e["name"] == "plan 3 dropped"));
    let moved = events["C"]
        .iter()
        .rev()
        .find(|e| e["name"] == "bytes swapped so far")
        .expect("the swapped bytes counter");
    assert_eq!(moved["args"]["to device"], f64::from(8u32 << 20));
}
