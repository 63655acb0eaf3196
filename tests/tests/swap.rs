//! The memory manager under `LD_PRELOAD`, on the simulated GPU: no byte is lost when the
//! footprint is several times the device, and its errors are the driver's.
//!
//! The training-like workload (`wl_train`) runs once without the shim on an unlimited
//! simulated GPU; its digests (losses, outputs, parameters, momenta) must come out bit for
//! bit the same under the shim with the device capped at 1/2, 1/4 and 1/8 of the footprint,
//! with randomized stream timing and the per-thread default stream, and the trace must show
//! that it really swapped both ways within the budget.

use tensile_tests::check::{read_trace, trace_stats};
use tensile_tests::expect::{fnv1a, named_digests};
use tensile_tests::harness::{temp_trace, Output, Run};
use tensile_trace::{Record, Stats, SwapDir};

const MIB: usize = 1 << 20;

/// The workload's shape: layers, tensor KiB, iterations. Footprint: (4 layers + 2) tensors.
const LAYERS: usize = 12;
const TENSOR_KIB: usize = 1536;
const ITERATIONS: usize = 2;
const FOOTPRINT: usize = (4 * LAYERS + 2) * TENSOR_KIB * 1024;

fn train(lookup: &str) -> Run {
    Run::new(env!("CARGO_BIN_EXE_wl_train"))
        .arg(lookup)
        .arg(LAYERS.to_string())
        .arg(TENSOR_KIB.to_string())
        .arg(ITERATIONS.to_string())
}

#[test]
fn no_byte_is_lost_at_a_half_a_quarter_and_an_eighth_of_the_footprint() {
    let native = train("proc:13000:0").output();
    native.assert_ok("the native run");
    let want = named_digests(&native.stdout);
    assert_eq!(
        want.len(),
        2 * ITERATIONS + 2 * LAYERS + 1,
        "{}",
        native.stdout
    );

    // (what, lookup, device capacity, jitter)
    let cases = [
        ("half", "proc:13000:0", FOOTPRINT / 2, 0),
        ("quarter", "dlsym:13000:0", FOOTPRINT / 4, 0),
        ("eighth", "proc:13000:0", FOOTPRINT / 8, 0),
        (
            "eighth, jitter, per-thread stream",
            "proc:13000:1",
            FOOTPRINT / 8,
            40,
        ),
    ];
    let results: Vec<(&str, usize, Output, Stats)> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .iter()
            .map(|&(what, lookup, capacity, jitter)| {
                scope.spawn(move || {
                    let trace = temp_trace(&format!("swap-{capacity}-{jitter}"));
                    let out = train(lookup)
                        .trace(&trace)
                        .env("TENSILE_POLICY", "lru")
                        .env("TENSILE_LOG", "info")
                        .env("TENSILE_SIM_DEVICE_MEMORY", capacity.to_string())
                        .env("TENSILE_SIM_JITTER_US", jitter.to_string())
                        .output();
                    out.assert_ok(what);
                    (what, capacity, out.clone(), trace_stats(&trace))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a run thread panicked"))
            .collect()
    });
    for (what, capacity, out, stats) in results {
        assert_eq!(
            named_digests(&out.stdout),
            want,
            "{what}: results differ from the unlimited run\n{}",
            out.stderr
        );
        // The device really was too small, and the manager stayed within it.
        let budget = capacity / (2 * MIB) * (2 * MIB);
        assert!(
            stats.bytes_to_host > 0 && stats.bytes_to_device > 0,
            "{what}: no swapping: {stats:?}"
        );
        assert!(
            stats.peak_resident_bytes as usize <= budget.max(2 * MIB),
            "{what}: peak {} over the budget {budget}",
            stats.peak_resident_bytes
        );
        assert!(stats.host_pool_bytes > 0, "{what}: {stats:?}");
        assert!(
            out.stderr.contains("tensile: swapped "),
            "{what}: no statistics at exit\n{}",
            out.stderr
        );
        out.assert_quiet(what);
    }
}

/// `TENSILE_SWAPPED=unmapped`: swapped-out pages are left unmapped, so a kernel or copy that
/// reached one without the shim bringing it back would fault the simulated GPU and fail the
/// run. Every access of the workload is foreseen: the results are the unlimited run's.
#[test]
fn with_swapped_pages_left_unmapped_no_byte_is_lost() {
    let native = train("proc:13000:0").output();
    native.assert_ok("the native run");
    let trace = temp_trace("swap-unmapped");
    let out = train("proc:13000:0")
        .trace(&trace)
        .env("TENSILE_POLICY", "lru")
        .env("TENSILE_SWAPPED", "unmapped")
        .env("TENSILE_LOG", "info")
        .env("TENSILE_SIM_DEVICE_MEMORY", (FOOTPRINT / 8).to_string())
        .env("TENSILE_SIM_JITTER_US", "40")
        .output();
    out.assert_ok("unmapped");
    assert_eq!(
        named_digests(&out.stdout),
        named_digests(&native.stdout),
        "results differ from the unlimited run\n{}",
        out.stderr
    );
    let stats = trace_stats(&trace);
    assert!(
        stats.bytes_to_host > 0 && stats.bytes_to_device > 0,
        "no swapping: {stats:?}"
    );
    assert!(
        out.stderr.contains("TENSILE_SWAPPED=unmapped"),
        "the mode is not said at start\n{}",
        out.stderr
    );
    out.assert_quiet("unmapped");
}

/// A driver whose VMM granularity is smaller than the H100's (`TENSILE_SIM_PAGE`, as `tensile
/// rerun --scale` sets it): the manager takes it as its page, says so, and loses nothing.
#[test]
fn with_the_drivers_smaller_page_no_byte_is_lost() {
    let native = train("proc:13000:0").output();
    native.assert_ok("the native run");
    let trace = temp_trace("swap-small-page");
    let out = train("proc:13000:0")
        .trace(&trace)
        .env("TENSILE_POLICY", "lru")
        .env("TENSILE_LOG", "info")
        .env("TENSILE_SIM_PAGE", "256KiB")
        .env("TENSILE_SIM_DEVICE_MEMORY", (FOOTPRINT / 8).to_string())
        .env("TENSILE_SIM_JITTER_US", "40")
        .output();
    out.assert_ok("256 KiB pages");
    assert_eq!(
        named_digests(&out.stdout),
        named_digests(&native.stdout),
        "results differ from the unlimited run\n{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(", page 256 KiB,"),
        "the manager does not use the driver's page\n{}",
        out.stderr
    );
    let stats = trace_stats(&trace);
    assert!(
        stats.bytes_to_host > 0 && stats.bytes_to_device > 0,
        "no swapping: {stats:?}"
    );
    let budget = FOOTPRINT / 8 / (256 << 10) * (256 << 10);
    assert!(
        stats.peak_resident_bytes as usize <= budget,
        "peak {} over the budget {budget}",
        stats.peak_resident_bytes
    );
    // Whole pages of 256 KiB move, not of 2 MiB: 1.5 MiB tensors are 6 pages each.
    assert!(
        !stats.bytes_to_host.is_multiple_of(2 * MIB as u64)
            || !stats.bytes_to_device.is_multiple_of(2 * MIB as u64),
        "{stats:?}"
    );
    out.assert_quiet("256 KiB pages");
}

#[test]
fn a_budget_above_the_footprint_swaps_nothing_and_policy_off_forwards() {
    let native = train("proc:13000:0").output();
    native.assert_ok("the native run");
    for policy in ["lru", "off"] {
        let trace = temp_trace(&format!("noswap-{policy}"));
        let out = train("proc:13000:0")
            .trace(&trace)
            .env("TENSILE_POLICY", policy)
            .env("TENSILE_DEVICE_MEMORY", "1GiB")
            .output();
        out.assert_ok(policy);
        assert_eq!(
            named_digests(&out.stdout),
            named_digests(&native.stdout),
            "{policy}"
        );
        let stats = trace_stats(&trace);
        assert_eq!(
            (stats.bytes_to_host, stats.bytes_to_device),
            (0, 0),
            "{policy}"
        );
    }
}

fn mem(mode: &str) -> Run {
    Run::new(env!("CARGO_BIN_EXE_wl_mem")).arg(mode)
}

/// The value of the `<prefix> <name>` line.
fn line<'a>(out: &'a Output, prefix: &str, name: &str) -> &'a str {
    let start = format!("{prefix} {name} ");
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix(start.as_str()))
        .unwrap_or_else(|| panic!("no `{start}` line in\n{}", out.stdout))
}

fn ipc(mode: &str) -> Run {
    Run::new(env!("CARGO_BIN_EXE_wl_ipc")).arg(mode)
}

/// Every line of `out`'s stdout that is exactly `want`, counted.
fn count_lines(out: &Output, want: &str) -> usize {
    out.stdout.lines().filter(|l| *l == want).count()
}

#[test]
fn arena_memory_shared_through_cuda_ipc_stays_on_the_device_while_its_exporter_swaps() {
    // A 4 MiB tensor shared with a child process under the shim, then 8 tensors of 4 MiB
    // swapped through a 12 MiB budget, twice.
    let trace = temp_trace("ipc-share");
    let out = ipc("share")
        .arg("8")
        .arg("4")
        .trace(&trace)
        .env("TENSILE_POLICY", "lru")
        .env("TENSILE_DEVICE_MEMORY", "12MiB")
        .env("TENSILE_LOG", "warn,tensile_shim::ipc=debug")
        .output();
    out.assert_ok("under the shim");
    for want in [
        "R export 0",
        "R same_handle 1",
        "R open 0",
        "C seen ok",
        "R open_again 0 1",
        "R close 0",
        "R child 1",
        "C others ok",
        "C shared ok",
        "ready",
        "C held ok",
        "R holder 1",
        "R reopen_refused 1",
    ] {
        assert!(
            count_lines(&out, want) >= 1,
            "no `{want}` in\n{}",
            out.stdout
        );
    }
    // The tensors allocated while the freed one was open elsewhere did not get its memory.
    assert_eq!(count_lines(&out, "C fresh ok"), 2, "{}", out.stdout);
    // The free waited for the holder, and was carried out once it closed.
    let deferred = |what: &str| out.stderr.lines().filter(|l| l.contains(what)).count();
    assert_eq!(
        deferred("waits for 1 process(es) that have it open"),
        1,
        "{}",
        out.stderr
    );
    assert_eq!(
        deferred("deferred while other processes had it open, is done"),
        1,
        "{}",
        out.stderr
    );
    out.assert_quiet("sharing");
    // It swapped, and never the shared tensor's pages.
    let shared = u64::from_str_radix(line(&out, "P", "shared"), 16).expect("a hex pointer");
    let t = read_trace(&trace);
    let _ = std::fs::remove_file(&trace);
    let page = 2 * MIB as u64;
    let mut out_pages = 0u64;
    for r in &t.records {
        if let Record::Swap(sw) = r {
            if sw.dir != SwapDir::ToHost {
                continue;
            }
            for &(start, pages) in &sw.runs {
                out_pages += u64::from(pages);
                let end = start + u64::from(pages) * page;
                assert!(
                    end <= shared || start >= shared + 4 * MIB as u64,
                    "pages {start:#x}..{end:#x} of the shared tensor at {shared:#x} left the device"
                );
            }
        }
    }
    assert!(out_pages >= 16, "it hardly swapped: {out_pages} pages out");
}

#[test]
fn a_handle_of_an_exporter_that_has_exited_is_refused_with_invalid_handle() {
    let exporter = ipc("handle")
        .preload(true)
        .env("TENSILE_POLICY", "lru")
        .output();
    exporter.assert_ok("the exporter");
    assert_eq!(line(&exporter, "R", "export"), "0");
    let handle = exporter
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("H "))
        .expect("an `H` line");
    let out = ipc("open")
        .arg(handle)
        .arg((4 * MIB).to_string())
        .arg("1")
        .arg("2")
        .preload(true)
        .env("TENSILE_POLICY", "lru")
        .output();
    out.assert_ok("the importer");
    // CUDA_ERROR_INVALID_HANDLE
    assert_eq!(line(&out, "R", "open"), "400", "{}", out.stdout);
    let said: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("cuIpcOpenMemHandle"))
        .collect();
    assert_eq!(said.len(), 1, "{}", out.stderr);
    assert!(said[0].contains("cannot be reached"), "{}", said[0]);
}

#[test]
fn handles_and_pointers_that_are_not_libtensiles_go_to_the_driver() {
    let native = ipc("foreign").output();
    native.assert_ok("native");
    let answers = ["get", "open_own", "open_garbage", "close_unknown"];
    // The simulated driver's answers: its own handle opened in its process is
    // CUDA_ERROR_INVALID_CONTEXT, bytes it never wrote CUDA_ERROR_INVALID_HANDLE, a pointer
    // never opened CUDA_ERROR_INVALID_VALUE.
    let want = ["0", "201", "400", "1"];
    for (name, code) in answers.iter().zip(want) {
        assert_eq!(line(&native, "R", name), code, "{name}");
    }
    // Without a manager the allocation is the driver's: everything is forwarded.
    let off = ipc("foreign")
        .preload(true)
        .env("TENSILE_POLICY", "off")
        .output();
    off.assert_ok("policy off").assert_quiet("policy off");
    for (name, code) in answers.iter().zip(want) {
        assert_eq!(line(&off, "R", name), code, "policy off: {name}");
    }
    // With one, the allocation is the arena's, but other handles and pointers still are the
    // driver's.
    let lru = ipc("foreign")
        .preload(true)
        .env("TENSILE_POLICY", "lru")
        .output();
    lru.assert_ok("policy lru").assert_quiet("policy lru");
    assert_eq!(line(&lru, "R", "open_garbage"), "400");
    assert_eq!(line(&lru, "R", "close_unknown"), "1");
}

#[test]
fn sharing_arena_memory_larger_than_the_budget_is_refused_with_one_line_and_loses_nothing() {
    // 16 MiB cannot be pinned on the device under an 8 MiB budget.
    let native = ipc("too_large").arg("16").output();
    native.assert_ok("native");
    let out = ipc("too_large")
        .arg("16")
        .preload(true)
        .env("TENSILE_POLICY", "lru")
        .env("TENSILE_DEVICE_MEMORY", "8MiB")
        .output();
    out.assert_ok("under the shim");
    // CUDA_ERROR_OUT_OF_MEMORY
    assert_eq!(line(&out, "R", "export"), "2");
    let said: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("cuIpcGetMemHandle"))
        .collect();
    assert_eq!(said.len(), 1, "{}", out.stderr);
    assert!(said[0].contains("refused"), "{}", said[0]);
    assert_eq!(line(&out, "C", "after"), "ok");
    assert_eq!(line(&out, "D", "after"), line(&native, "D", "after"));
}

#[test]
fn a_launch_needing_more_than_the_budget_is_out_of_memory_and_nothing_else_breaks() {
    // Two 6 MiB tensors under an 8 MiB budget: each fits, both at once do not.
    let native = mem("oom").arg("6").output();
    native.assert_ok("native");
    assert_eq!(line(&native, "R", "copy_both"), "0");
    let out = mem("oom")
        .arg("6")
        .preload(true)
        .env("TENSILE_POLICY", "lru")
        .env("TENSILE_DEVICE_MEMORY", "8MiB")
        .output();
    out.assert_ok("under the shim");
    // CUDA_ERROR_OUT_OF_MEMORY
    assert_eq!(line(&out, "R", "copy_both"), "2");
    let oom_lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("kernel `copy_u32`"))
        .collect();
    assert_eq!(oom_lines.len(), 1, "{}", out.stderr);
    assert!(
        oom_lines[0].contains("12582912 bytes") && oom_lines[0].contains("budget of 8 MiB"),
        "{}",
        oom_lines[0]
    );
    // The copy did not happen, everything else did: a holds the pattern, b its memset
    // value doubled.
    assert_eq!(line(&out, "D", "a"), line(&native, "D", "a"));
    let doubled = (f32::from_bits(0x0101_0101) * 2.0).to_le_bytes();
    let b: Vec<u8> = doubled.iter().copied().cycle().take(6 * MIB).collect();
    assert_eq!(line(&out, "D", "b"), format!("{:016x}", fnv1a(&b)));
}

#[test]
fn bad_frees_get_the_drivers_error_codes() {
    let native = mem("frees").output();
    native.assert_ok("native");
    let out = mem("frees")
        .preload(true)
        .env("TENSILE_POLICY", "lru")
        .output();
    out.assert_ok("under the shim");
    for name in ["double_free", "double_free_async", "unknown_free"] {
        let code = line(&native, "R", name);
        assert_ne!(code, "0", "{name}: the simulator accepted a bad free");
        assert_eq!(line(&out, "R", name), code, "{name}");
    }
    assert_eq!(line(&out, "D", "after"), line(&native, "D", "after"));
}

#[test]
fn mem_get_info_reports_the_budget() {
    let out = mem("info")
        .preload(true)
        .env("TENSILE_POLICY", "lru")
        .env("TENSILE_DEVICE_MEMORY", "24MiB")
        .env("TENSILE_SIM_DEVICE_MEMORY", "1GiB")
        .output();
    out.assert_ok("under the shim");
    let parse = |v: &str| -> (usize, usize) {
        let (f, t) = v.split_once(' ').expect("two numbers");
        (f.parse().expect("free"), t.parse().expect("total"))
    };
    let (free0, total0) = parse(line(&out, "M", "before"));
    let (free1, total1) = parse(line(&out, "M", "after"));
    assert_eq!((total0, total1), (24 * MIB, 24 * MIB));
    assert_eq!(free0, 24 * MIB);
    assert!(
        (24 * MIB - 8 * MIB..=24 * MIB - 6 * MIB).contains(&free1),
        "{free1}"
    );
    // Without a budget the card's view comes through (the simulator's capacity).
    let out = mem("info")
        .preload(true)
        .env("TENSILE_POLICY", "off")
        .env("TENSILE_SIM_DEVICE_MEMORY", "1GiB")
        .output();
    out.assert_ok("policy off");
    assert_eq!(parse(line(&out, "M", "before")).1, 1 << 30);
}

#[test]
fn a_bad_memory_setting_is_one_clear_line_and_the_default() {
    let out = mem("info")
        .preload(true)
        .env("TENSILE_POLICY", "lru")
        .env("TENSILE_DEVICE_MEMORY", "lots")
        .env("TENSILE_SIM_DEVICE_MEMORY", "64MiB")
        .output();
    out.assert_ok("bad setting");
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("TENSILE_DEVICE_MEMORY"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    assert!(lines[0].contains("\"lots\""), "{}", lines[0]);
    // The default: the card's free memory less headroom (on a 64 MiB card, an eighth).
    assert_eq!(
        line(&out, "M", "before").split(' ').nth(1),
        Some("58720256")
    );
}

#[test]
fn pytorch_gets_the_stream_ordered_allocator_unless_the_user_chose() {
    let out = mem("env").preload(true).env("TENSILE_LOG", "info").output();
    out.assert_ok("unset");
    assert!(
        out.stdout.contains("V backend:cudaMallocAsync\n"),
        "{}",
        out.stdout
    );
    assert!(
        out.stderr
            .contains("set PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync"),
        "{}",
        out.stderr
    );

    let out = mem("env")
        .preload(true)
        .env("PYTORCH_CUDA_ALLOC_CONF", "backend:native")
        .output();
    out.assert_ok("user's choice");
    assert!(out.stdout.contains("V backend:native\n"), "{}", out.stdout);
    let warnings = out
        .stderr
        .lines()
        .filter(|l| l.contains("PYTORCH_CUDA_ALLOC_CONF"))
        .count();
    assert_eq!(warnings, 1, "{}", out.stderr);

    let out = mem("env")
        .preload(true)
        .env("TENSILE_POLICY", "off")
        .output();
    out.assert_ok("policy off");
    assert!(out.stdout.contains("V <unset>\n"), "{}", out.stdout);

    let out = mem("env").output();
    out.assert_ok("without the shim");
    assert!(out.stdout.contains("V <unset>\n"), "{}", out.stdout);
}

/// Builds `tests/src/fake_cublas.c` (a library that reaches the driver as cuBLAS does) as
/// `libcublasFake.so` with the system C compiler.
fn fake_cublas() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tensile-fake-cublas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let lib = dir.join("libcublasFake.so");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/fake_cublas.c");
    let out = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("running cc (a C compiler is needed for this test)");
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    lib
}

#[test]
fn cublas_like_libraries_get_the_drivers_own_allocations() {
    let lib = fake_cublas();
    let lib_arg = lib.to_string_lossy().into_owned();
    for (policy, library_managed) in [("lru", false), ("off", true)] {
        let trace = temp_trace(&format!("library-{policy}"));
        let out = mem("library")
            .arg(lib_arg.clone())
            .trace(&trace)
            .env("TENSILE_POLICY", policy)
            .output();
        out.assert_ok(policy);
        let ptr = |name: &str| u64::from_str_radix(line(&out, "P", name), 16).expect("hex");
        let t = read_trace(&trace);
        let _ = std::fs::remove_file(&trace);
        let traced: Vec<u64> = t
            .records
            .iter()
            .filter_map(|r| match r {
                Record::Alloc(a) => Some(a.ptr),
                _ => None,
            })
            .collect();
        // The application's own allocation is always seen (and managed under lru).
        assert!(traced.contains(&ptr("app")), "{policy}: {traced:x?}");
        // The library's are the driver's own under a managing policy: the shim never sees
        // them. With policy off every allocation is wrapped and traced, as before.
        for name in ["gpa", "dlsym"] {
            assert_eq!(
                traced.contains(&ptr(name)),
                library_managed,
                "{policy}: the library's allocation through {name}: {traced:x?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(lib.parent().expect("a directory"));
}
