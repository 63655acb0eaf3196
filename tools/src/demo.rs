//! `tensile demo`: a training-like workload at about four times the device budget, under
//! libtensile, checked bit for bit against a run with unlimited memory.
//!
//! The workload is `wl_train` (from `tensile-tests`: parameters, optimizer state, forward
//! activations kept for the backward pass, two streams). Everything is found next to the
//! `tensile` binary, where `cargo build --release --workspace` puts it: `libtensile.so`,
//! `wl_train` and the simulated GPU's `libcuda.so`. On a machine whose own `libcuda.so.1`
//! has a device, the workload runs on that GPU (the budget then comes from
//! `TENSILE_DEVICE_MEMORY`); otherwise on the simulated GPU, whose capacity is set to the
//! budget. The swap statistics come from the `Stats` record of the managed run's trace.
//!
//! Not here: any memory management (that is the library), or a PyTorch workload (see the
//! benchmark scripts).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use tensile_trace::{Reader, Record, Stats};

use crate::workdir::{run_echoing, WorkDir};

const MIB: u64 = 1 << 20;

/// Arguments of `tensile demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Layers of the model (each: parameters, gradient, momentum, one kept activation).
    #[arg(long, default_value_t = 16)]
    pub layers: u64,
    /// Size of every tensor, KiB (not a multiple of the 2 MiB page, on purpose).
    #[arg(long, default_value_t = 1536)]
    pub tensor_kib: u64,
    /// Training iterations.
    #[arg(long, default_value_t = 3)]
    pub iterations: u64,
    /// The footprint is this many times the device budget.
    #[arg(long, default_value_t = 4)]
    pub ratio: u64,
    /// Run on the simulated GPU even if this machine has a real one.
    #[arg(long)]
    pub simulated: bool,
    /// Keep the working directory (trace, logs) and print where it is.
    #[arg(long)]
    pub keep: bool,
}

/// Everything the demo runs, found next to the `tensile` binary.
struct Pieces {
    library: PathBuf,
    workload: PathBuf,
    simulator: PathBuf,
}

fn find_pieces() -> Result<Pieces, String> {
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the tensile binary: {e}"))?;
    let dir = exe
        .parent()
        .ok_or("the tensile binary has no directory")?
        .to_path_buf();
    let pieces = Pieces {
        library: dir.join("libtensile.so"),
        workload: dir.join("wl_train"),
        simulator: dir.join("libcuda.so"),
    };
    let missing: Vec<String> = [&pieces.library, &pieces.workload, &pieces.simulator]
        .iter()
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "missing next to the tensile binary: {}; run cargo build --release --workspace",
            missing.join(", ")
        ));
    }
    Ok(pieces)
}

/// Whether the machine's own driver has a device (asked in a child process, so a broken
/// driver cannot take the demo down).
fn real_gpu(workload: &Path) -> bool {
    Command::new(workload)
        .arg("probe")
        .env_remove("LD_PRELOAD")
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success())
}

/// One run of the workload: its digests and how long it took.
struct RunResult {
    digests: BTreeMap<String, String>,
    seconds: f64,
}

/// Runs the workload with `env`, echoing its progress lines under `label`.
fn run_workload(
    workload: &Path,
    args: &DemoArgs,
    env: &[(&str, String)],
    label: &str,
) -> Result<RunResult, String> {
    let mut cmd = Command::new(workload);
    cmd.arg("proc:13000:0")
        .arg(args.layers.to_string())
        .arg(args.tensor_kib.to_string())
        .arg(args.iterations.to_string())
        .env_remove("LD_PRELOAD");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let label = label.to_owned();
    let what = format!("{}", workload.display());
    let (out, log) = run_echoing(cmd, &what, move |line| {
        if let Some(progress) = line.strip_prefix("wl_train: ") {
            println!("  [{label}] {progress}");
        } else if let Some(at) = line.find("tensile: ") {
            // The library's own lines, without the log's timestamp and target; the allocator
            // and trace notices are not news here.
            let message = &line[at..];
            if !message.contains("PYTORCH_CUDA_ALLOC_CONF")
                && !message.contains("writing the trace")
            {
                println!("  [{label}] {message}");
            }
        }
    })?;
    if !out.status.success() {
        let tail: Vec<&String> = log.iter().rev().take(20).collect();
        let tail: Vec<&str> = tail.iter().rev().map(|s| s.as_str()).collect();
        return Err(format!(
            "the workload failed ({}):\n{}",
            out.status,
            tail.join("\n")
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let digests = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("D "))
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    Ok(RunResult {
        digests,
        seconds: start.elapsed().as_secs_f64(),
    })
}

fn read_stats(trace: &Path) -> Result<Stats, String> {
    let reader = Reader::open(trace)
        .map_err(|e| format!("cannot read the trace {}: {e}", trace.display()))?;
    for record in reader {
        if let Ok(Record::Stats(s)) = record {
            return Ok(s);
        }
    }
    Err(format!("the trace {} has no statistics", trace.display()))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}

/// The smallest device budget the demo runs at: four 2 MiB pages, because the optimizer step
/// touches three tensors at once and each may straddle a page boundary.
const MIN_BUDGET: u64 = 8 * MIB;

/// The device budget for `footprint` bytes at `ratio` times the budget; a ratio that would
/// put the budget under [`MIN_BUDGET`] is refused with the largest one that would not
/// (rather than quietly running at a smaller ratio than asked).
fn demo_budget(footprint: u64, ratio: u64) -> Result<u64, String> {
    let budget = footprint / ratio;
    if budget >= MIN_BUDGET {
        return Ok(budget);
    }
    let largest = footprint / MIN_BUDGET;
    let advice = if largest >= 1 {
        format!("at this footprint --ratio is at most {largest}; ")
    } else {
        String::new()
    };
    Err(format!(
        "--ratio {ratio}: the device budget would be {} of a {} footprint, under the demo's \
         floor of {} (four 2 MiB pages: the optimizer step touches three tensors at once); \
         {advice}raise --layers or --tensor-kib for a higher ratio",
        mib(budget),
        mib(footprint),
        mib(MIN_BUDGET)
    ))
}

/// Runs `tensile demo`.
pub fn run(args: DemoArgs) -> Result<(), String> {
    if args.layers == 0 || args.tensor_kib == 0 || args.iterations == 0 || args.ratio == 0 {
        return Err("--layers, --tensor-kib, --iterations and --ratio must be positive".into());
    }
    let footprint = (4 * args.layers + 2) * args.tensor_kib * 1024;
    let budget = demo_budget(footprint, args.ratio)?;
    let pieces = find_pieces()?;
    let gpu = !args.simulated && real_gpu(&pieces.workload);
    let work = WorkDir::new("demo", &pieces.simulator, args.keep)?;
    println!(
        "tensile demo: {} layers, tensors of {} KiB, {} iterations: footprint {}, device budget {} \
         ({:.1}x), on {}",
        args.layers,
        args.tensor_kib,
        args.iterations,
        mib(footprint),
        mib(budget),
        footprint as f64 / budget as f64,
        if gpu { "this machine's GPU" } else { "the simulated GPU" },
    );

    let mut base_env: Vec<(&str, String)> = Vec::new();
    if !gpu {
        base_env.push(("LD_LIBRARY_PATH", work.path.display().to_string()));
    }
    println!("1/2 reference run, unlimited memory, without libtensile");
    let reference = run_workload(&pieces.workload, &args, &base_env, "reference")?;
    println!("    done in {:.1} s", reference.seconds);

    let trace = work.path.join("demo.trace");
    let mut env = base_env.clone();
    env.push(("LD_PRELOAD", pieces.library.display().to_string()));
    env.push(("TENSILE_POLICY", "lru".into()));
    env.push(("TENSILE_LOG", "info".into()));
    env.push(("TENSILE_TRACE", trace.display().to_string()));
    // The budget is set on the simulator too: its default leaves headroom below the card.
    env.push(("TENSILE_DEVICE_MEMORY", budget.to_string()));
    if !gpu {
        env.push(("TENSILE_SIM_DEVICE_MEMORY", budget.to_string()));
    }
    println!(
        "2/2 managed run, {} of device memory, under libtensile (TENSILE_POLICY=lru)",
        mib(budget)
    );
    let managed = run_workload(&pieces.workload, &args, &env, "managed")?;
    println!("    done in {:.1} s", managed.seconds);

    if reference.digests.is_empty() {
        return Err("the reference run printed no results".into());
    }
    let differing: Vec<&String> = reference
        .digests
        .iter()
        .filter(|(k, v)| managed.digests.get(*k) != Some(*v))
        .map(|(k, _)| k)
        .collect();
    if !differing.is_empty() || managed.digests.len() != reference.digests.len() {
        return Err(format!(
            "FAILED: results differ from the unlimited run: {differing:?}"
        ));
    }
    println!(
        "verified: all {} results (losses, outputs, parameters, optimizer state) are identical \
         bit for bit",
        reference.digests.len()
    );
    let s = read_stats(&trace)?;
    println!("swap statistics:");
    println!("  swapped out to host      {}", mib(s.bytes_to_host));
    println!("  swapped in to device     {}", mib(s.bytes_to_device));
    println!(
        "  stalled accesses         {} ({:.1} ms of host time waiting)",
        s.stalled_launches,
        s.stall_ns as f64 / 1e6
    );
    println!("  peak resident            {}", mib(s.peak_resident_bytes));
    println!("  pinned host pool         {}", mib(s.host_pool_bytes));
    if args.keep {
        println!("kept {}", work.path.display());
    }
    println!("demo: success");
    Ok(())
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    #[test]
    fn a_ratio_the_floor_allows_is_kept_exactly() {
        let footprint = 66 * 1536 * 1024; // the defaults: 16 layers of 1536 KiB tensors
        assert_eq!(demo_budget(footprint, 4), Ok(footprint / 4));
        assert_eq!(demo_budget(footprint, 12), Ok(footprint / 12));
    }

    #[test]
    fn a_ratio_under_the_floor_is_refused_with_the_largest_that_fits() {
        let footprint = 66 * 1536 * 1024;
        let err = demo_budget(footprint, 100).unwrap_err();
        assert!(err.contains("--ratio 100"), "{err}");
        assert!(err.contains("at most 12"), "{err}");
        assert!(err.contains("8.0 MiB"), "{err}");
        let tiny = demo_budget(4 * MIB, 2).unwrap_err();
        assert!(!tiny.contains("at most"), "{tiny}");
    }
}
