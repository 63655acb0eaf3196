//! Every call path of a driver program reaches libtensile, the trace records exactly what
//! the program did (each launch with exactly the allocations it was given), and results
//! are bit-identical with and without the shim.

use tensile_tests::check::{canonical, compare_in_order, compare_unordered, normalize, read_trace};
use tensile_tests::expect::{digests, expectations, Expect};
use tensile_tests::harness::{temp_trace, Output, Run};
use tensile_trace::Record;

const RAW: &str = env!("CARGO_BIN_EXE_wl_raw");
const STREAMS: &str = env!("CARGO_BIN_EXE_wl_streams");
const THREADS: &str = env!("CARGO_BIN_EXE_wl_threads");
const CUDARC: &str = env!("CARGO_BIN_EXE_wl_cudarc");

/// Runs `exe args` three ways (no shim, shim without trace, shim with trace), checks that
/// all three print the same digests, and returns the traced run's output and its trace
/// events next to the expectations it printed.
fn three_ways(exe: &str, args: &[&str]) -> (Output, Vec<Record>) {
    let run = || args.iter().fold(Run::new(exe), |r, a| r.arg(*a));
    let what = format!("{exe} {}", args.join(" "));
    let plain = run().output();
    plain.assert_ok(&format!("{what} without the shim"));
    // The simulator randomizes stream interleaving here, to shake out ordering bugs.
    let shim = run()
        .preload(true)
        .env("TENSILE_SIM_JITTER_US", "50")
        .output();
    shim.assert_ok(&format!("{what} under the shim"));
    let path = temp_trace("e2e");
    let traced = run().trace(&path).output();
    traced.assert_ok(&format!("{what} under the shim, traced"));
    let want = digests(&plain.stdout);
    assert!(!want.is_empty(), "{what} printed no digests");
    assert_eq!(
        digests(&shim.stdout),
        want,
        "{what}: results differ under the shim"
    );
    assert_eq!(
        digests(&traced.stdout),
        want,
        "{what}: results differ when traced"
    );
    assert!(
        !traced.stderr.contains("WARN") && !traced.stderr.contains("ERROR"),
        "{what}: {}",
        traced.stderr
    );
    let t = read_trace(&path);
    assert!(
        t.finished_cleanly,
        "{what}: trace not closed cleanly ({:?})",
        t.error
    );
    let _ = std::fs::remove_file(&path);
    (traced, t.records)
}

fn header_and_end(what: &str, records: &[Record]) {
    let Some(Record::Header(h)) = records.first() else {
        panic!("{what}: no header")
    };
    assert!(
        h.producer.starts_with("libtensile"),
        "{what}: producer {:?}",
        h.producer
    );
    assert!(h.command.contains("wl_"), "{what}: command {:?}", h.command);
    let Some(Record::End(end)) = records.last() else {
        panic!("{what}: last record is not End")
    };
    assert_eq!(end.dropped_records, 0, "{what}");
    assert!(
        records
            .iter()
            .any(|r| matches!(r, Record::Stats(s) if s.peak_resident_bytes > 0)),
        "{what}: no stats"
    );
}

#[test]
fn raw_driver_programs_are_fully_traced_through_every_lookup_path() {
    let configs = [
        ("proc:12000:0", "module"),
        ("proc:13000:2", "library"),
        ("proc:13000:1", "module"),
        ("dlsym:13000:0", "library"),
        ("dlsym:12000:2", "module"),
        ("default:13000:0", "module"),
        ("default:13000:2", "library"),
    ];
    for (lookup, form) in configs {
        let what = format!("wl_raw {lookup} {form}");
        let (out, records) = three_ways(RAW, &[lookup, form]);
        header_and_end(&what, &records);
        let want = canonical(expectations(&out.stdout));
        assert!(want.len() > 40, "{what}: only {} expectations", want.len());
        if let Err(e) = compare_in_order(&normalize(&records), &want) {
            panic!("{what}: {e}");
        }
    }
}

#[test]
fn streams_async_allocation_extra_form_and_struct_params_are_traced() {
    for lookup in ["proc:13000:0", "proc:13000:2", "dlsym:13000:2"] {
        let what = format!("wl_streams {lookup}");
        let (out, records) = three_ways(STREAMS, &[lookup]);
        header_and_end(&what, &records);
        let want = canonical(expectations(&out.stdout));
        // The gather4 launches must resolve all five pointers inside the struct.
        let gathers: Vec<_> = want
            .iter()
            .filter(|e| matches!(e, Expect::Launch { kernel, accesses, .. } if kernel == "gather4" && accesses.len() == 5))
            .collect();
        assert_eq!(gathers.len(), 3, "{what}");
        if let Err(e) = compare_in_order(&normalize(&records), &want) {
            panic!("{what}: {e}");
        }
    }
}

#[test]
fn threads_started_before_the_first_cuda_call_are_all_traced() {
    for lookup in ["proc:13000:0", "dlsym:13000:2"] {
        let what = format!("wl_threads {lookup}");
        let (out, records) = three_ways(THREADS, &[lookup, "6"]);
        header_and_end(&what, &records);
        let want = canonical(expectations(&out.stdout));
        if let Err(e) = compare_unordered(&normalize(&records), &want) {
            panic!("{what}: {e}");
        }
    }
}

#[test]
fn a_cudarc_program_is_traced_through_dlsym() {
    let (out, records) = three_ways(CUDARC, &[]);
    header_and_end("wl_cudarc", &records);
    let events = normalize(&records);
    // cudarc decides itself how to allocate and copy; the program knows its launches and
    // the buffers it owns.
    let launches: Vec<Expect> = events
        .iter()
        .filter(|e| matches!(e, Expect::Launch { .. }))
        .cloned()
        .collect();
    let want = canonical(expectations(&out.stdout));
    assert_eq!(want.len(), 4);
    if let Err(e) = compare_in_order(&launches, &want) {
        panic!("wl_cudarc: {e}");
    }
    for line in out.stdout.lines().filter(|l| l.starts_with("B ")) {
        let ptr = u64::from_str_radix(
            line.split_whitespace()
                .nth(2)
                .unwrap()
                .trim_start_matches("0x"),
            16,
        )
        .unwrap();
        let allocs = events
            .iter()
            .filter(|e| matches!(e, Expect::Alloc { ptr: p, .. } if *p == ptr))
            .count();
        let frees = events
            .iter()
            .filter(|e| matches!(e, Expect::Free { ptr: p, .. } if *p == ptr))
            .count();
        assert_eq!(
            (allocs, frees),
            (1, 1),
            "{line}: allocated and freed once each in the trace"
        );
    }
    assert!(events
        .iter()
        .any(|e| matches!(e, Expect::Copy { kind, .. } if kind == "htod")));
    assert!(events
        .iter()
        .any(|e| matches!(e, Expect::Copy { kind, .. } if kind == "dtoh")));
}

#[test]
fn launch_times_come_from_the_gpu_clock() {
    let path = temp_trace("timing");
    let out = Run::new(RAW)
        .arg("proc:13000:2")
        .arg("module")
        .env("TENSILE_SIM_KERNEL_US", "500")
        .trace(&path)
        .output();
    out.assert_ok("wl_raw with modelled kernel time");
    let t = read_trace(&path);
    let _ = std::fs::remove_file(&path);
    let mut launched = std::collections::HashSet::new();
    let mut timed = std::collections::HashMap::new();
    for r in &t.records {
        match r {
            Record::Launch(l) => assert!(launched.insert(l.seq), "launch seq {} twice", l.seq),
            Record::LaunchTime(lt) => {
                assert!(
                    launched.contains(&lt.seq),
                    "time for launch {} before the launch",
                    lt.seq
                );
                assert!(
                    timed.insert(lt.seq, lt.gpu_ns).is_none(),
                    "launch {} timed twice",
                    lt.seq
                );
            }
            _ => {}
        }
    }
    assert_eq!(launched.len(), 8, "wl_raw launches eight kernels");
    // The workload waits for the device after its last launch, so every launch is timed.
    assert_eq!(timed.len(), launched.len(), "launches without a time");
    for (seq, ns) in timed {
        assert!(
            (500_000..5_000_000_000).contains(&ns),
            "launch {seq}: {ns} ns for a 500 us kernel"
        );
    }
}
