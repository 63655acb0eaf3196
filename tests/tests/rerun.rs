//! `tensile rerun` end to end on the simulated GPU: reduced reruns of the shared PyTorch
//! traces (few iterations, sizes divided, recorded times shortened) under libtensile with a
//! budget that forces swapping; the JSON contract; the fault switch caught by the stamps; and
//! bad input refused with one clear line.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use tensile_tests::harness::{artifacts, describe as text};

fn shared(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../analyzer/tests/data/{name}.trace.gz"))
}

fn rerun(args: &[&str], env: &[(&str, &str)]) -> Output {
    let a = artifacts();
    let mut cmd = Command::new(&a.tensile);
    cmd.arg("rerun").args(args).env_remove("LD_PRELOAD");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output()
        .unwrap_or_else(|e| panic!("running {}: {e}", a.tensile.display()))
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}):\n{}", text(out)))
}

/// What every reduced rerun here plays: on the simulated GPU, sizes / 64, recorded times x
/// 0.05, a budget of 60% of the peak; one JSON object out.
const REDUCED: [&str; 8] = [
    "--simulated",
    "--json",
    "--scale",
    "64",
    "--time-scale",
    "0.05",
    "--budget",
    "60%",
];

/// A reduced rerun: two iterations, lru.
fn reduced(name: &str, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let trace = shared(name);
    let mut args = vec![trace.to_str().expect("UTF-8 path")];
    args.extend_from_slice(&REDUCED);
    args.extend_from_slice(&["--iterations", "2", "--policy", "lru"]);
    args.extend_from_slice(extra);
    rerun(&args, env)
}

/// The keys and types `tensile rerun --json` promises.
fn check_contract(doc: &Value, out: &Output) {
    let ctx = text(out);
    assert!(doc["trace"].is_string(), "{ctx}");
    assert!(doc["iterations"].is_u64(), "{ctx}");
    assert!(doc["time_scale"].is_f64(), "{ctx}");
    assert!(doc["scale"].is_u64(), "{ctx}");
    assert!(doc["budget_bytes"].is_u64(), "{ctx}");
    assert!(doc["native_step_ns"].is_u64(), "{ctx}");
    let runs = doc["runs"]
        .as_array()
        .unwrap_or_else(|| panic!("no runs: {ctx}"));
    assert!(!runs.is_empty(), "{ctx}");
    for r in runs {
        assert!(r["policy"].is_string(), "{ctx}");
        assert!(r["step_ns"].is_u64(), "{ctx}");
        assert!(
            r["predicted_ns"].is_u64() || r["predicted_ns"].is_null(),
            "{ctx}"
        );
        for key in ["bytes_h2d", "bytes_d2h", "stall_ns", "stamps_checked"] {
            assert!(r[key].is_u64(), "{key}: {ctx}");
        }
        assert!(r["verified"].is_boolean(), "{ctx}");
        if r["verified"] == Value::Bool(true) {
            // The library's host time from its trace: the stalled accesses' spans sum to the
            // stall its statistics count.
            let host = &r["host_ns"];
            for key in [
                "stalled_accesses",
                "other_calls_waited",
                "remaps_in",
                "remaps_out",
            ] {
                assert!(host[key].is_u64(), "{key}: {ctx}");
            }
            let (spans, stall) = (
                host["stalled_accesses"].as_u64().unwrap(),
                r["stall_ns"].as_u64().unwrap(),
            );
            assert!(
                spans.abs_diff(stall) <= stall / 100 + 1_000,
                "stalls: spans {spans} ns, statistics {stall} ns: {ctx}"
            );
            // On the simulated card: where its time went, from its engine log. Its kernels
            // ran for their recorded time, and a step is at least that and the idle time.
            if doc["device"] == "simulated" {
                let card = &r["card"];
                let get = |key: &str| {
                    card[key]
                        .as_u64()
                        .unwrap_or_else(|| panic!("card {key}: {ctx}"))
                };
                let compute = get("compute_ns");
                assert!(compute > 0, "{ctx}");
                let idle = get("idle_for_host_ns") + get("idle_for_copies_ns");
                let step = r["step_ns"].as_u64().unwrap();
                assert!(
                    compute + idle <= step + step / 2,
                    "{card} vs step {step}: {ctx}"
                );
                assert!(
                    card["h2d_busy_ns"].is_u64() && card["d2h_busy_ns"].is_u64(),
                    "{ctx}"
                );
            }
        }
    }
}

#[test]
fn reduced_reruns_of_the_shared_traces_verify_every_stamp_under_swapping() {
    for name in ["mlp", "resnet50", "bert"] {
        let out = reduced(name, &[], &[]);
        assert!(out.status.success(), "{name}: {}", text(&out));
        let doc = json(&out);
        check_contract(&doc, &out);
        assert_eq!(doc["iterations"], 2, "{name}");
        assert_eq!(doc["scale"], 64, "{name}");
        assert!(doc["native_step_ns"].as_u64() > Some(0), "{name}");
        let run = &doc["runs"][0];
        assert_eq!(run["policy"], "lru", "{name}");
        assert_eq!(run["verified"], true, "{name}: {}", text(&out));
        assert!(run["stamps_checked"].as_u64() > Some(1000), "{name}: {run}");
        // At 60% of the peak the library must have moved data both ways. (The per-iteration
        // figures are a difference of two runs' totals; with two iterations the library's
        // eviction timing can make one of them zero, so they are only type-checked here.)
        for key in ["run_bytes_h2d", "run_bytes_d2h"] {
            assert!(run[key].as_u64() > Some(0), "{name}: no {key}: {run}");
        }
        assert!(run["predicted_ns"].as_u64() > Some(0), "{name}: {run}");
    }
}

#[test]
fn predict_only_prints_the_predictions_a_played_run_is_compared_with() {
    let predicted = reduced("mlp", &["--predict-only"], &[]);
    assert!(predicted.status.success(), "{}", text(&predicted));
    let doc = json(&predicted);
    let lru = &doc["predictions"][0];
    assert_eq!(lru["policy"], "lru", "{doc}");
    assert!(lru["step_ns"].as_u64() > Some(0), "{doc}");
    assert!(
        !String::from_utf8_lossy(&predicted.stderr).contains("native run"),
        "--predict-only played something: {}",
        text(&predicted)
    );
    let played = reduced("mlp", &[], &[]);
    assert!(played.status.success(), "{}", text(&played));
    let run = &json(&played)["runs"][0];
    assert_eq!(lru["step_ns"], run["predicted_ns"], "{run}");
    assert_eq!(lru["bytes_h2d"], run["predicted"]["bytes_h2d"], "{run}");
}

#[test]
fn a_broken_swap_is_caught_by_the_stamps_and_named() {
    let out = reduced("mlp", &[], &[("TENSILE_RERUN_FAULT", "stale:1")]);
    assert!(
        !out.status.success(),
        "the fault went unnoticed: {}",
        text(&out)
    );
    let doc = json(&out);
    check_contract(&doc, &out);
    let run = &doc["runs"][0];
    assert_eq!(run["verified"], false, "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("tensile: lru run: stamp mismatch: allocation ")
            && last.contains(" at op ")
            && last.contains("steady-state iteration 1"),
        "{}",
        text(&out)
    );
    // The native run does not get the fault (it models a broken swap).
    assert!(doc["native_step_ns"].as_u64() > Some(0));
}

/// The MLP, then ResNet-50 in the same process, reduced, five iterations each, under the plan.
fn switching(extra: &[&str], env: &[(&str, &str)]) -> Output {
    let (mlp, resnet) = (shared("mlp"), shared("resnet50"));
    let mut args = vec![
        mlp.to_str().expect("UTF-8 path"),
        "--then",
        resnet.to_str().expect("UTF-8 path"),
    ];
    args.extend_from_slice(&REDUCED);
    args.extend_from_slice(&["--iterations", "5", "--policy", "plan"]);
    args.extend_from_slice(extra);
    rerun(&args, env)
}

#[test]
fn a_rerun_that_switches_traces_drops_the_first_plan_and_plans_the_second_trace() {
    let out = switching(&[], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let doc = json(&out);
    let ctx = text(&out);
    assert_eq!(doc["phases"].as_array().map(Vec::len), Some(2), "{ctx}");
    for phase in doc["phases"].as_array().unwrap() {
        assert!(phase["native_step_ns"].as_u64() > Some(0), "{ctx}");
    }
    let run = &doc["runs"][0];
    assert_eq!(run["policy"], "plan", "{ctx}");
    assert_eq!(run["verified"], true, "{ctx}");
    assert!(run["stamps_checked"].as_u64() > Some(1000), "{ctx}");
    let phases = run["phases"].as_array().expect("phases");
    assert_eq!(phases.len(), 2, "{ctx}");
    // Each trace got a plan of its own, the second after the first's was dropped.
    let first_plan = |p: &Value| -> (u64, u64) {
        let f = &p["first_plan"];
        (
            f["version"]
                .as_u64()
                .unwrap_or_else(|| panic!("no plan: {ctx}")),
            f["applies_from_launch"].as_u64().unwrap(),
        )
    };
    let (v1, from1) = first_plan(&phases[0]);
    let (v2, from2) = first_plan(&phases[1]);
    assert!(v2 > v1 && from2 > from1, "{ctx}");
    let plans = run["plans"].as_array().expect("plans");
    let dropped_first = plans
        .iter()
        .find(|p| p["version"] == v1)
        .and_then(|p| p["until_launch"].as_u64())
        .unwrap_or_else(|| panic!("the first trace's plan was never dropped: {ctx}"));
    assert!(dropped_first <= from2, "{ctx}");
    // Iterations played under the second trace's plan (all of each) show as such, and none
    // of the second trace's begins under a plan before its first one.
    let planned: Vec<bool> = phases[1]["iteration_plan"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| !v.is_null())
        .collect();
    let before = phases[1]["first_plan"]["iterations_before"]
        .as_u64()
        .unwrap() as usize;
    assert!(planned[..before].iter().all(|p| !p), "{ctx}");
    assert!(planned[before..].iter().any(|p| *p), "{ctx}");
    assert_eq!(
        planned.len(),
        phases[1]["iteration_ns"].as_array().unwrap().len(),
        "{ctx}"
    );
}

#[test]
fn a_stale_stamp_after_the_switch_is_caught_and_named_with_its_trace() {
    // The fault comes in the second trace's first measured iteration (the same settings
    // without it pass, above).
    let out = switching(&[], &[("TENSILE_RERUN_FAULT", "stale:1")]);
    assert!(!out.status.success(), "{}", text(&out));
    let doc = json(&out);
    let run = &doc["runs"][0];
    assert_eq!(run["verified"], false, "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("tensile: plan run: trace 2: stamp mismatch: allocation ")
            && last.contains("steady-state iteration 1"),
        "{}",
        text(&out)
    );
    // --then with --card is refused before anything runs.
    let out = switching(&["--card", "x", "--card-memory", "1GiB"], &[]);
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--then does not take --card"),
        "{}",
        text(&out)
    );
    assert!(!stderr.contains("native run"), "{}", text(&out));
}

#[test]
fn bad_traces_and_settings_are_refused_with_one_clear_line() {
    let dir = std::env::temp_dir().join(format!("tensile-rerun-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let bytes = std::fs::read(shared("mlp")).expect("the MLP trace");
    let cut = dir.join("cut.trace.gz");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).expect("writing the cut trace");
    let junk = dir.join("junk.trace");
    std::fs::write(&junk, b"not a trace at all\n").expect("writing junk");
    for (path, want) in [(&cut, "truncated"), (&junk, "junk.trace")] {
        let out = rerun(&[path.to_str().unwrap(), "--simulated"], &[]);
        assert!(!out.status.success(), "{}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{}", text(&out));
        assert!(out.stdout.is_empty(), "{}", text(&out));
    }
    // A trace larger than the memory allowed is refused with the scale that would fit.
    let bert = shared("bert");
    let out = rerun(
        &[bert.to_str().unwrap(), "--simulated"],
        &[("TENSILE_RERUN_MEMORY_LIMIT", "1GiB")],
    );
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{}", text(&out));
    assert!(stderr.contains("use --scale 16"), "{}", text(&out));
    let out = rerun(&[bert.to_str().unwrap(), "--policy", "fifo"], &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--policy \"fifo\""));
    // A room the library would not take is refused before anything runs.
    let out = reduced("mlp", &[], &[("TENSILE_PLAN_ROOM", "lots")]);
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("TENSILE_PLAN_ROOM=\"lots\" is not valid"),
        "{}",
        text(&out)
    );
    assert!(!stderr.contains("native run"), "{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A capture-format trace of a step on two streams that share allocations: stream 0x1 writes
/// the parameters and an activation, stream 0x2 reads them and writes a gradient the next op on
/// 0x1 reads; a transient buffer lives on 0x2. Eight identical steps, each ending with a host
/// wait for the whole device.
fn two_stream_trace() -> String {
    let clock = std::cell::Cell::new(1_000u64);
    let tick = || {
        clock.set(clock.get() + 1_000);
        clock.get()
    };
    let mut out = String::from("# capture v1\n");
    for k in 1..=4 {
        out += &format!("N {k} 3 _Z7step_op{k}v\n");
    }
    let (params, act, grad) = (1, 2, 3);
    out += &format!("A {} 0x1 {params} 7f0000000000 4194304\n", tick());
    out += &format!("A {} 0x1 {act} 7f0000400000 2097152\n", tick());
    out += &format!("A {} 0x2 {grad} 7f0000600000 2097152\n", tick());
    let mut seq = 0;
    for step in 0..8u64 {
        let mut launch = |out: &mut String, kernel: u32, stream: &str, touches: &[u64], ns: u64| {
            seq += 1;
            let ids: Vec<String> = touches
                .iter()
                .enumerate()
                .map(|(i, id)| format!("{id}@{}", i * 8))
                .collect();
            *out += &format!(
                "K {} {stream} {seq} {kernel} 1,1,1 128,1,1 0 {}\nD {seq} {ns}\n",
                tick(),
                ids.join(" ")
            );
        };
        launch(&mut out, 1, "0x1", &[params, act], 400_000);
        launch(&mut out, 2, "0x2", &[params, act, grad], 300_000);
        let tmp = 10 + step;
        out += &format!("A {} 0x2 {tmp} 7f0000800000 8388608\n", tick());
        launch(&mut out, 3, "0x2", &[grad, tmp], 200_000);
        out += &format!("F {} 0x2 {tmp}\n", tick());
        launch(&mut out, 4, "0x1", &[params, grad], 100_000);
        out += &format!("S {} all\n", tick());
    }
    out
}

#[test]
fn work_on_two_streams_is_ordered_where_it_shares_allocations() {
    let dir = std::env::temp_dir().join(format!("tensile-rerun-streams-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("two-streams.trace");
    std::fs::write(&path, two_stream_trace()).expect("writing the trace");
    // Jitter shuffles how the simulated streams interleave: without the player's event
    // ordering, a launch on one stream would see stamps the other had not written yet.
    let args = |policy: &str| -> Vec<String> {
        [
            path.to_str().unwrap(),
            "--simulated",
            "--json",
            "--iterations",
            "4",
            "--budget",
            "75%",
            "--policy",
            policy,
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let lru = args("lru");
    let lru: Vec<&str> = lru.iter().map(String::as_str).collect();
    let out = rerun(&lru, &[("TENSILE_SIM_JITTER_US", "200")]);
    assert!(out.status.success(), "{}", text(&out));
    let doc = json(&out);
    check_contract(&doc, &out);
    let run = &doc["runs"][0];
    assert_eq!(run["verified"], true, "{}", text(&out));
    assert!(run["stamps_checked"].as_u64() > Some(40), "{run}");
    // Under a plan, with --logs: each run's whole log is kept, the library's lines in it.
    let logs = dir.join("logs");
    let mut plan = args("plan");
    plan.extend(["--logs".to_owned(), logs.to_str().unwrap().to_owned()]);
    let plan: Vec<&str> = plan.iter().map(String::as_str).collect();
    let out = rerun(&plan, &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(json(&out)["runs"][0]["verified"], true, "{}", text(&out));
    for (file, want) in [
        ("plan.log", "memory manager on device"),
        ("plan.log", "swapped "),
        ("plan-baseline.log", "memory manager on device"),
    ] {
        let log = std::fs::read_to_string(logs.join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}; {}", text(&out)));
        assert!(log.contains(want), "{want:?} not in {file}:\n{log}");
    }
    assert!(logs.join("native.log").exists());
    // And each managed run's trace, which trace-info reads.
    let info = Command::new(&artifacts().tensile)
        .arg("trace-info")
        .arg(logs.join("plan.trace"))
        .output()
        .expect("tensile trace-info");
    assert!(info.status.success(), "{}", text(&info));
    // With the library's own work in it: its swaps and host time (a budget of 75% swaps),
    // and the plan, where one came.
    let report = String::from_utf8_lossy(&info.stdout);
    for want in [
        "library swaps out: ",
        "library swaps in: ",
        "library host time: ",
    ] {
        assert!(report.contains(want), "{want:?} not in:\n{report}");
    }
    let log = std::fs::read_to_string(logs.join("plan.log")).unwrap();
    if log.contains("plan 1 installed") {
        assert!(report.contains("plan 1 loaded at launch "), "{report}");
    }
    assert!(logs.join("plan-baseline.trace").exists());
    // Four launches of 1.0 ms per step: the native step is at least the recorded compute
    // only once the simulator keeps kernel time; here it must at least have run.
    assert!(doc["native_step_ns"].as_u64() > Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_native_trace_of_a_two_stream_workload_reruns_verified() {
    // wl_train: per layer parameters, gradient, momentum and a kept activation; forward and
    // backward on one stream, the optimizer on another, ordered by events.
    let path = tensile_tests::harness::temp_trace("rerun-native");
    tensile_tests::harness::Run::new(env!("CARGO_BIN_EXE_wl_train"))
        .arg("proc:13000:0")
        .arg("6")
        .arg("1024")
        .arg("6")
        .trace(&path)
        .output()
        .assert_ok("wl_train traced");
    let out = rerun(
        &[
            path.to_str().unwrap(),
            "--simulated",
            "--json",
            "--iterations",
            "3",
            "--budget",
            "50%",
            "--policy",
            "lru",
        ],
        &[("TENSILE_SIM_JITTER_US", "100")],
    );
    assert!(out.status.success(), "{}", text(&out));
    let doc = json(&out);
    check_contract(&doc, &out);
    let run = &doc["runs"][0];
    assert_eq!(run["verified"], true, "{}", text(&out));
    assert!(run["stamps_checked"].as_u64() > Some(100), "{run}");
    assert!(
        run["run_bytes_d2h"].as_u64() > Some(0),
        "no swapping: {run}"
    );
    let _ = std::fs::remove_file(&path);
}
