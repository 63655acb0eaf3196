//! The `tensile` command as a user runs it: `run` preloads the library and passes its flags
//! on, `trace-info` reads what was recorded, `replay` simulates it.

use std::process::Command;

use tensile_tests::expect::digests;
use tensile_tests::harness::{artifacts, temp_trace, Run};
use tensile_trace::{Reader, Record};

const TRAIN: &str = env!("CARGO_BIN_EXE_wl_train");
const TRAIN_ARGS: [&str; 4] = ["proc:12000:0", "6", "128", "3"];

fn tensile(args: &[&str]) -> std::process::Output {
    let a = artifacts();
    Command::new(&a.tensile)
        .args(args)
        .env("LD_LIBRARY_PATH", &a.simgpu_dir)
        .env_remove("LD_PRELOAD")
        .env_remove("TENSILE_TRACE")
        .output()
        .unwrap_or_else(|e| panic!("running tensile: {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn run_preloads_traces_and_trace_info_and_replay_read_the_trace() {
    let trace = temp_trace("cli-run");
    let trace_arg = trace.to_string_lossy().into_owned();
    let mut args = vec!["run", "--trace", &trace_arg, "--policy", "off", "--", TRAIN];
    args.extend(TRAIN_ARGS);
    let managed = tensile(&args);
    assert!(managed.status.success(), "{}", text(&managed.stderr));

    let mut plain = Run::new(TRAIN);
    for a in TRAIN_ARGS {
        plain = plain.arg(a);
    }
    let plain = plain.output();
    plain.assert_ok("wl_train without the shim");
    let (with, without) = (digests(&text(&managed.stdout)), digests(&plain.stdout));
    assert!(!with.is_empty(), "the workload printed no digests");
    assert_eq!(with, without, "results differ under `tensile run`");

    // The trace is complete, and trace-info counts what it holds.
    let records: Vec<Record> = Reader::open(&trace)
        .expect("tensile run wrote a trace")
        .collect::<Result<_, _>>()
        .expect("the trace reads back whole");
    assert!(matches!(records.last(), Some(Record::End(_))));
    let launches = records
        .iter()
        .filter(|r| matches!(r, Record::Launch(_)))
        .count();
    assert!(launches > 50, "only {launches} launches traced");

    let info = tensile(&["trace-info", &trace_arg]);
    let report = text(&info.stdout);
    assert!(info.status.success(), "{}", text(&info.stderr));
    assert!(
        report.contains(&format!("launches: {launches} on")),
        "{report}"
    );
    assert!(
        report.contains("with a resolved allocation: 100.00000%"),
        "{report}"
    );
    assert!(report.contains("sgd_momentum"), "{report}");
    assert!(!report.contains("no end marker"), "{report}");
    assert!(report.contains("swap statistics: to host 0 B"), "{report}");

    // The recorded run as a Perfetto timeline: the workload's kernels, by name, on the tracks of
    // its streams (the format itself is checked in detail by the tools' own tests).
    let timeline = temp_trace("cli-timeline");
    let timeline_arg = timeline.to_string_lossy().into_owned();
    let info = tensile(&["trace-info", &trace_arg, "--timeline", &timeline_arg]);
    assert!(info.status.success(), "{}", text(&info.stderr));
    let json = std::fs::read_to_string(&timeline).expect("the timeline was written");
    let _ = std::fs::remove_file(&timeline);
    assert!(
        json.starts_with("{\"displayTimeUnit\":\"ms\",\"traceEvents\":["),
        "{json:.200}"
    );
    assert!(
        json.contains("\"name\":\"sgd_momentum\""),
        "no kernel by name"
    );
    let streams = json.matches("\"args\":{\"name\":\"stream ").count();
    assert!(
        streams >= 2,
        "{streams} stream tracks for a two-stream workload"
    );
    assert!(
        json.contains("\"cat\":\"swap\""),
        "no swap statistics in the timeline"
    );

    // Three training steps: replay finds the iteration and keeps the plan within budget.
    let replay = tensile(&["replay", &trace_arg, "--budget", "50%", "--json"]);
    let json = text(&replay.stdout);
    assert!(replay.status.success(), "{}", text(&replay.stderr));
    assert!(json.contains("\"policy\": \"plan\""), "{json}");
    let _ = std::fs::remove_file(&trace);
}

#[test]
fn trace_info_reports_a_cut_trace_and_refuses_a_foreign_file() {
    let trace = temp_trace("cli-cut");
    let mut run = Run::new(TRAIN).trace(&trace).env("TENSILE_POLICY", "off");
    for a in TRAIN_ARGS {
        run = run.arg(a);
    }
    let run = run.output();
    run.assert_ok("wl_train traced");
    let bytes = std::fs::read(&trace).expect("trace written");
    let cut = temp_trace("cli-cut-short");
    // Two bytes short: inside the checksum of the last frame, as a crash mid-write leaves it.
    std::fs::write(&cut, &bytes[..bytes.len() - 2]).expect("writing the cut copy");
    let info = tensile(&["trace-info", &cut.to_string_lossy()]);
    assert!(info.status.success(), "{}", text(&info.stderr));
    assert!(
        text(&info.stdout).contains("truncated after"),
        "{}",
        text(&info.stdout)
    );

    let foreign = tensile(&["trace-info", "/etc/hostname"]);
    assert!(!foreign.status.success());
    // Refused by the importer that reads both formats, which says what it expected.
    assert!(
        text(&foreign.stderr).contains("is not a trace: expected a tensile trace"),
        "{}",
        text(&foreign.stderr)
    );
    for path in [trace, cut] {
        let _ = std::fs::remove_file(path);
    }
}

#[test]
fn run_explains_a_missing_library() {
    let out = tensile(&[
        "run",
        "--library",
        "/nonexistent/libtensile.so",
        "--",
        "true",
    ]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("/nonexistent/libtensile.so does not exist"));
}

#[test]
fn run_refuses_a_bad_budget_before_the_program_starts() {
    let marker = temp_trace("cli-bad-budget-ran");
    let _ = std::fs::remove_file(&marker);
    let marker_arg = marker.to_string_lossy().into_owned();
    // No `--`: the program's name ends tensile's own flags.
    let out = tensile(&["run", "--budget", "abc", "touch", &marker_arg]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--budget \"abc\": `abc` is not a number"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(!marker.exists(), "the program ran despite the bad budget");

    let ok = tensile(&["run", "--policy", "off", "touch", &marker_arg]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    assert!(marker.exists(), "`tensile run CMD` without -- runs CMD");
    let _ = std::fs::remove_file(&marker);
}
