//! The allocation microbenchmark (`wl_allocbench`, driven by `bench/gpu/alloc_bench.sh`) on
//! the simulated GPU, with few rounds: it runs to the end natively and under libtensile,
//! prints every case once with sane numbers, and under the shim the memory manager served it
//! (`cuMemGetInfo` reports the budget) and every allocation and free reached the trace.
//! Timings are not checked: on the simulator they say little, and not here.

use tensile_tests::check::read_trace;
use tensile_tests::harness::{temp_trace, Output, Run};
use tensile_trace::{AllocKind, Record};

const ROUNDS: usize = 20;
/// Each case and how many allocations one round makes.
const CASES: [(&str, usize); 5] = [
    ("512B", 1),
    ("64KiB", 1),
    ("2MiB", 1),
    ("64MiB", 1),
    ("mix", 10),
];
const BUDGET: u64 = 256 << 20;

fn bench() -> Run {
    Run::new(env!("CARGO_BIN_EXE_wl_allocbench")).arg(ROUNDS.to_string())
}

/// One table row: api, case, bytes, rounds, pairs, ns per pair, OOM syncs.
type Row = (String, String, u64, usize, usize, f64, usize);

fn rows(out: &Output) -> Vec<Row> {
    out.stdout
        .lines()
        .filter(|l| l.starts_with("async ") || l.starts_with("sync "))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 7, "a row has 7 fields: {l}");
            let num = |i: usize| -> f64 {
                f[i].parse()
                    .unwrap_or_else(|_| panic!("field {i} of `{l}` is not a number"))
            };
            (
                f[0].to_owned(),
                f[1].to_owned(),
                num(2) as u64,
                num(3) as usize,
                num(4) as usize,
                num(5),
                num(6) as usize,
            )
        })
        .collect()
}

/// Every case once per API, in order, with the rounds asked for and plausible numbers.
#[track_caller]
fn check_table(out: &Output, what: &str) {
    out.assert_ok(what);
    assert_eq!(
        out.stdout.lines().last(),
        Some("done"),
        "{what}: {}",
        out.stdout
    );
    let rows = rows(out);
    assert_eq!(rows.len(), 2 * CASES.len(), "{what}: {}", out.stdout);
    for (i, row) in rows.iter().enumerate() {
        let api = if i < CASES.len() { "async" } else { "sync" };
        let (case, per_round) = CASES[i % CASES.len()];
        let (a, c, bytes, rounds, pairs, ns, _) = row;
        assert_eq!((a.as_str(), c.as_str()), (api, case), "{what}: row {i}");
        assert_eq!(
            (*rounds, *pairs),
            (ROUNDS, ROUNDS * per_round),
            "{what}: {row:?}"
        );
        assert!(ns.is_finite() && *ns > 0.0, "{what}: {row:?}");
        let expected_bytes = match case {
            "512B" => 512,
            "64KiB" => 64 << 10,
            "2MiB" => 2 << 20,
            "64MiB" => 64 << 20,
            _ => *bytes,
        };
        assert!(*bytes > 0 && *bytes == expected_bytes, "{what}: {row:?}");
    }
}

/// `(free, total)` of the `I` line.
fn mem_info(out: &Output) -> (u64, u64) {
    let l = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("I "))
        .unwrap_or_else(|| panic!("no I line in {}", out.stdout));
    let mut it = l.split(' ').map(|v| v.parse::<u64>().expect("a number"));
    (it.next().expect("free"), it.next().expect("total"))
}

#[test]
fn runs_natively_and_under_the_shim_with_every_case_served_by_the_manager() {
    let native = bench().output();
    check_table(&native, "native");
    let (_, native_total) = mem_info(&native);
    assert_ne!(
        native_total, BUDGET,
        "the simulated card must differ from the budget"
    );

    let trace = temp_trace("allocbench");
    let shim = bench()
        .trace(&trace)
        .env("TENSILE_POLICY", "lru")
        .env("TENSILE_DEVICE_MEMORY", BUDGET.to_string())
        .output();
    check_table(&shim, "under the shim");
    // With the manager, cuMemGetInfo is the budget's view.
    let (free, total) = mem_info(&shim);
    assert_eq!(total, BUDGET, "{}", shim.stdout);
    assert!(free <= total);
    // The arena reuses memory freed on the stream at once: no allocation had to wait.
    assert!(
        rows(&shim).iter().all(|r| r.6 == 0),
        "OOM retries under the shim: {}",
        shim.stdout
    );

    // Per API and case: warm-up (rounds / 10) and timed rounds, plus one usability check
    // per size; each allocation is freed.
    let per_api: usize = CASES
        .iter()
        .map(|&(_, k)| (ROUNDS + (ROUNDS / 10).max(1)) * k + k)
        .sum();
    let t = read_trace(&trace);
    let _ = std::fs::remove_file(&trace);
    let count = |kind: AllocKind| {
        t.records
            .iter()
            .filter(|r| matches!(r, Record::Alloc(a) if a.kind == kind))
            .count()
    };
    let frees = t
        .records
        .iter()
        .filter(|r| matches!(r, Record::Free(_)))
        .count();
    assert_eq!(
        (count(AllocKind::Async), count(AllocKind::Sync), frees),
        (per_api, per_api, 2 * per_api)
    );
}

#[test]
fn json_output_is_one_object_per_line() {
    let out = bench().arg("json").output();
    out.assert_ok("json");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2 * CASES.len() + 1, "{}", out.stdout);
    for l in &lines[..2 * CASES.len()] {
        assert!(l.starts_with("{\"api\":\"") && l.ends_with('}'), "{l}");
        for key in [
            "\"case\":",
            "\"bytes\":",
            "\"rounds\":20,",
            "\"ns_per_pair\":",
        ] {
            assert!(l.contains(key), "{key} missing in {l}");
        }
    }
    assert!(
        lines[2 * CASES.len()].starts_with("{\"free\":"),
        "{}",
        out.stdout
    );
}
