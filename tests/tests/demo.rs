//! `tensile demo` end to end: it finds its pieces next to the `tensile` binary, runs the
//! training-like workload on the simulated GPU at four times the budget under libtensile,
//! and reports the bit-for-bit check and the swap statistics.

use std::process::Command;

use tensile_tests::harness::artifacts;

#[test]
fn tensile_demo_verifies_its_results_and_reports_swapping() {
    let a = artifacts();
    // The workload binary must be next to `tensile` (cargo puts this package's binaries
    // there when it builds the tests).
    let _ = env!("CARGO_BIN_EXE_wl_train");
    let out = Command::new(&a.tensile)
        .args(["demo", "--layers", "8", "--iterations", "1", "--simulated"])
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", a.tensile.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("unrecognized subcommand 'demo'"),
        "the `demo` subcommand is not wired into tools/src/main.rs yet:\n{stderr}"
    );
    assert!(
        out.status.success(),
        "tensile demo failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(stdout.contains("on the simulated GPU"), "{stdout}");
    assert!(stdout.contains("iteration 1 of 1 done"), "{stdout}");
    assert!(
        stdout.contains("verified: all 19 results") && stdout.contains("bit for bit"),
        "{stdout}"
    );
    // It really swapped, both ways.
    let mib = |label: &str| -> f64 {
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no `{label}` line in\n{stdout}"));
        line.split_whitespace()
            .rev()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no number in {line:?}"))
    };
    assert!(mib("swapped out to host") > 0.0, "{stdout}");
    assert!(mib("swapped in to device") > 0.0, "{stdout}");
    assert!(mib("peak resident") <= 12.75, "{stdout}");
    assert!(stdout.trim_end().ends_with("demo: success"), "{stdout}");
}

#[test]
fn tensile_demo_says_what_to_build_when_pieces_are_missing() {
    let a = artifacts();
    let dir = std::env::temp_dir().join(format!("tensile-demo-missing-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let lone = dir.join("tensile");
    std::fs::copy(&a.tensile, &lone).expect("copying tensile");
    let out = Command::new(&lone)
        .arg("demo")
        .output()
        .expect("running the copied tensile");
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("missing next to the tensile binary")
            && stderr.contains("libtensile.so")
            && stderr.contains("run cargo build --release --workspace"),
        "{stderr}"
    );
}
