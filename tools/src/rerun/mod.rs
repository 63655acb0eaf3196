//! `tensile rerun`: plays a recorded training step back as a driver program, natively and
//! under libtensile, and sets the measured step time beside `tensile replay`'s prediction.
//!
//! The trace becomes a [`script::Script`] here (prologue once, then the analyzer's
//! steady-state iteration N times, sizes divided by `--scale`, durations multiplied by
//! `--time-scale`); the hidden `tensile rerun-player` subcommand ([`player`]) plays it in a
//! child process, once without the library and once per policy with `LD_PRELOAD`. Every launch
//! is the stand-in kernel `tensile_rerun_op`, which checks and rewrites a stamp in every piece
//! of the allocations it touches, so data that swapping lost fails the run. The swap
//! statistics come from the `Stats` record of the managed run's trace: the per-iteration
//! figures are the difference between the full run and a baseline run of the prologue and one
//! iteration, divided by N - 1.
//!
//! Not here: the prediction (that is `tensile-analyzer`, called in-process as `tensile replay`
//! calls it) or any memory management (that is the library).

mod card_log;
mod driver;
pub mod player;
pub mod script;
mod switch;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use serde_json::{json, Value};
use tensile_analyzer::bound::BoundOptions;
use tensile_analyzer::cost::{format_bytes, parse_size};
use tensile_analyzer::cycle::{Cycle, MoveUnits};
use tensile_analyzer::evaluate::lru_moves_per_tensor;
use tensile_analyzer::import::{load, LoadOptions};
use tensile_analyzer::model::Trace;
use tensile_analyzer::online::{budgets_to_try, room_from_env};
use tensile_analyzer::search::SearchOptions;
use tensile_analyzer::{
    analyze, evaluate_many_with, Analysis, Budget, CostModel, PageRemapCost, PolicyKind,
    RemapModel, SHIM_MAX_UNIT_PAGES, SHIM_PLAN_UNIT_PAGES,
};
use tensile_trace::{BusyKind, Reader, Record, Stats};

use crate::trace_info::busy_name;
use crate::workdir::{run_echoing, WorkDir};
use script::Scaling;

/// Arguments of `tensile rerun`.
#[derive(clap::Args, Debug)]
pub struct RerunArgs {
    /// Trace file (the project's format or capture format v1, gzipped or not).
    pub trace: PathBuf,
    /// Steady-state iterations to play after the prologue.
    #[arg(long, default_value_t = 8)]
    pub iterations: u32,
    /// Device memory budget for the managed runs: bytes with a unit (4GiB, 512MiB) or a
    /// percentage of the steady-state iteration's peak allocated bytes (50%), as `tensile
    /// replay` reads it. Before --scale.
    /// Default 50%; with --card, none: the coordinator's grant decides.
    #[arg(long)]
    pub budget: Option<String>,
    /// Policy of the managed run: plan, lru, off (no managed run), or all (lru and plan).
    #[arg(long, default_value = "lru")]
    pub policy: String,
    /// Every recorded GPU duration is multiplied by K (and the modelled copy bandwidth divided
    /// by K on the simulated GPU); step times are reported divided by K again. Default: 1 on a
    /// GPU, 16 on the simulated GPU (whose own cost per operation, about 100 µs on a small
    /// machine, would otherwise add to every kernel shorter than that).
    #[arg(long)]
    pub time_scale: Option<f64>,
    /// Every size, the budget and the modelled copy bandwidth are divided by F (a whole
    /// number), so a trace larger than this machine runs with the same timing.
    #[arg(long)]
    pub scale: Option<u64>,
    /// Run on the simulated GPU even if this machine has a real one.
    #[arg(long)]
    pub simulated: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Play the managed run on the simulated card NAME shared with other processes
    /// (TENSILE_SIM_CARD) and join coordinator NAME (started if none runs), which divides the
    /// card's memory among the jobs on it. Needs --policy plan and --card-memory; the native
    /// run is skipped (the jobs on the card are measured against each other).
    #[arg(long, value_name = "NAME")]
    pub card: Option<String>,
    /// The shared card's memory, as played (after --scale): bytes with a unit. Every job on
    /// the card must give the same.
    #[arg(long, value_name = "SIZE")]
    pub card_memory: Option<String>,
    /// TENSILE_PRIORITY of the managed run: high, normal or low.
    #[arg(long)]
    pub priority: Option<String>,
    /// Keep each run's whole log (the player's and the library's lines on stderr) in DIR, as
    /// native.log, lru.log, lru-baseline.log, plan.log, plan-baseline.log, and each managed
    /// run's trace beside it (lru.trace, ...: `tensile trace-info TRACE --timeline out.json`
    /// shows what the GPU waited on).
    #[arg(long, value_name = "DIR")]
    pub logs: Option<PathBuf>,
    /// Then play TRACE2 in the same process (the first's memory freed): a program that changes
    /// what it runs. Says per trace when a plan was in force, and each iteration's time.
    #[arg(long, value_name = "TRACE2")]
    pub then: Option<PathBuf>,
    /// Print each policy's prediction (as the runs would be compared with) and play
    /// nothing: seconds instead of minutes, to see what a budget or the environment's
    /// TENSILE_* settings change in the model.
    #[arg(long)]
    pub predict_only: bool,
}

/// A simulated card shared with other reruns (`--card`).
#[derive(Debug, Clone)]
struct SharedCard {
    name: String,
    /// Bytes, as played.
    capacity: u64,
    priority: Option<String>,
    /// Whether the job has a budget of its own (`--budget` given): its grant's cap.
    limited: bool,
}

/// Arguments of the hidden `tensile rerun-player`.
#[derive(clap::Args, Debug)]
pub struct PlayerArgs {
    /// The script `tensile rerun` wrote.
    pub script: PathBuf,
    /// A second script, played after the first in the same process (`tensile rerun --then`).
    #[arg(long)]
    pub then: Option<PathBuf>,
    /// Play this many iterations instead of the script's.
    #[arg(long)]
    pub iterations: Option<u32>,
    /// Exit 0 if this machine's driver has a device, else 1; play nothing.
    #[arg(long)]
    pub probe: bool,
}

/// Runs the hidden player subcommand.
pub fn player_main(args: PlayerArgs) -> ExitCode {
    if args.probe {
        return match player::probe() {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        };
    }
    match player::run(&args.script, args.then.as_deref(), args.iterations) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(code) => ExitCode::from(code as u8),
        Err(message) => {
            eprintln!("rerun-player: {message}");
            ExitCode::from(2)
        }
    }
}

/// Everything the runs need, found next to the `tensile` binary.
struct Pieces {
    tensile: PathBuf,
    library: PathBuf,
    simulator: PathBuf,
}

fn find_pieces() -> Result<Pieces, String> {
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the tensile binary: {e}"))?;
    let dir = exe.parent().ok_or("the tensile binary has no directory")?;
    let pieces = Pieces {
        tensile: exe.clone(),
        library: dir.join("libtensile.so"),
        simulator: dir.join("libcuda.so"),
    };
    let missing: Vec<String> = [&pieces.library, &pieces.simulator]
        .iter()
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "missing next to the tensile binary: {}; run cargo build --release -p tensile-tools \
             -p tensile-ld-preload -p tensile-simgpu",
            missing.join(", ")
        ));
    }
    Ok(pieces)
}

/// The copy bandwidths of GPU_FACTS.md (GB/s), which `tensile replay` also assumes.
const PCIE_GBPS: f64 = 55.0;
/// Both directions at once on the H100 (GPU_FACTS.md), GB/s.
const PCIE_DUPLEX_GBPS: f64 = 92.0;

/// The simulated card's rates (GB/s) of `TENSILE_SIM_TIMING=h100` (tests/simgpu/README.md), by
/// setting: both directions alone, both at once, pageable memory, a kernel reading host memory,
/// copies within the device.
const H100_RATES: [(&str, f64); 6] = [
    ("TENSILE_SIM_H2D_GBPS", PCIE_GBPS),
    ("TENSILE_SIM_D2H_GBPS", PCIE_GBPS),
    ("TENSILE_SIM_DUPLEX_GBPS", PCIE_DUPLEX_GBPS),
    ("TENSILE_SIM_PAGEABLE_GBPS", 8.0),
    ("TENSILE_SIM_HOST_ACCESS_GBPS", 50.0),
    ("TENSILE_SIM_DEVICE_GBPS", 1500.0),
];

/// The simulated GPU's settings for a run: capacity, and the H100's rates scaled with the sizes
/// and the time scale so that a copy takes the time the recorded one took, times K. Kernels take
/// their stand-in's duration argument (the recorded time times K) on the card's one compute
/// engine. (The one place that knows the simulator's setting names.)
///
/// The page shrinks with the sizes ([`played_page`]), so that a scaled tensor covers as many
/// pages as the real one and the library maps, moves and remaps as many; VMM calls then cost
/// what they cost on the card times K (times `scale` times the page's share of 2 MiB where
/// the page could not shrink by all of `scale`: one page then stands for more trace bytes).
fn simulator_env(capacity: u64, scale: u64, time_scale: f64) -> Vec<(String, String)> {
    let page = played_page(scale);
    let vmm = vmm_time(scale, time_scale);
    let mut env = vec![
        ("TENSILE_SIM_DEVICE_MEMORY".into(), capacity.to_string()),
        ("TENSILE_SIM_TIMING".into(), "h100".into()),
        ("TENSILE_SIM_VMM_TIME".into(), format!("{vmm}")),
        ("TENSILE_SIM_PAGE".into(), page.to_string()),
    ];
    for (name, gbps) in H100_RATES {
        env.push((name.into(), format!("{}", gbps / scale as f64 / time_scale)));
    }
    env
}

/// The card's VMM page (the H100's granularity).
const CARD_PAGE_BYTES: u64 = 2 << 20;

/// How many times the card's VMM calls take on the simulated GPU as it is played: the time
/// scale, and more where the page could not shrink by all of `scale` ([`simulator_env`]).
fn vmm_time(scale: u64, time_scale: f64) -> f64 {
    time_scale * (scale * played_page(scale)) as f64 / CARD_PAGE_BYTES as f64
}

/// The smallest page the simulated GPU takes (`TENSILE_SIM_PAGE`).
const MIN_PLAYED_PAGE: u64 = 64 << 10;

/// The simulated page for a run at `--scale F`: 2 MiB / F, rounded down to a power of two, at
/// least 64 KiB (the simulator's range).
fn played_page(scale: u64) -> u64 {
    let exact = CARD_PAGE_BYTES / scale.max(1);
    let pow2 = if exact.is_power_of_two() {
        exact
    } else {
        exact.checked_next_power_of_two().map_or(exact, |p| p / 2)
    };
    pow2.max(MIN_PLAYED_PAGE)
}

/// The settings that make the library's planner price moves as the simulated card runs them:
/// `cost`'s copy rates scaled like the simulator's (`TENSILE_PLAN_GBPS`), and the remap calls
/// at the simulator's times (`TENSILE_PLAN_VMM_TIME`).
fn planner_env(cost: &CostModel, scale: u64, time_scale: f64) -> [(String, String); 2] {
    let rate = |gbps: f64| gbps / scale as f64 / time_scale;
    [
        (
            "TENSILE_PLAN_GBPS".into(),
            format!(
                "{},{},{}",
                rate(cost.h2d_gbps),
                rate(cost.d2h_gbps),
                rate(cost.bidir_gbps)
            ),
        ),
        (
            "TENSILE_PLAN_VMM_TIME".into(),
            format!("{}", vmm_time(scale, time_scale)),
        ),
    ]
}

/// What one run of the player reported.
struct PlayerOutput {
    json: Value,
    stats: Option<Stats>,
    /// The library's host time over the run, by kind (`Record::Busy`).
    host: HostTime,
    /// The library's line about the plan executor at exit, as `name value` pairs.
    executor: Option<BTreeMap<String, u64>>,
    /// Plans the library's planner announced (`plan N learned: ...` lines).
    plans_learned: Vec<String>,
}

/// How the library's line on a change of the room its plans leave begins (the planning
/// thread's `adapt_room`).
const ROOM_LINE: &str = "plans now leave ";

/// The room the run's plans left when it ended, if the run changed it (the last line of
/// `plan_lines` that says so).
fn final_room(plan_lines: &[String]) -> Option<f64> {
    plan_lines.iter().rev().find_map(|l| {
        let percent = l.strip_prefix(ROOM_LINE)?.split('%').next()?;
        percent.trim().parse::<f64>().ok().map(|p| p / 100.0)
    })
}

/// The library's lines on the plans a run learned and dropped (the executor's warning says
/// where and why), from `plan ` on. A plan dropped at the player's last launch, the check of
/// every stamp, was dropped after the last iteration, which the executor cannot tell: the line
/// says so.
fn plan_lines(log: &[String]) -> Vec<String> {
    let final_check = format!("got `tensile_rerun_op_k{}`", script::FINAL_CHECK_KERNEL);
    log.iter()
        .filter_map(|l| {
            if let Some(at) = l.find(ROOM_LINE) {
                return Some(l[at..].to_owned());
            }
            let at = l
                .find("plan ")
                .filter(|_| l.contains(" learned: ") || l.contains(" dropped at launch "))?;
            let mut line = l[at..].to_owned();
            if let Some(end) = line.find(&final_check).map(|i| i + final_check.len()) {
                line.insert_str(
                    end,
                    " (the final check of every stamp, after the last iteration)",
                );
            }
            Some(line)
        })
        .collect()
}

/// The `name value` pairs of the library's `plan executor: ...` line, if the log has one.
fn executor_line(log: &[String]) -> Option<BTreeMap<String, u64>> {
    let line = log.iter().rev().find_map(|l| {
        l.find("plan executor: ")
            .map(|at| &l[at + "plan executor: ".len()..])
    })?;
    let words: Vec<&str> = line.split_whitespace().collect();
    Some(
        words
            .chunks(2)
            .filter_map(|kv| match kv {
                [k, v] => v.parse().ok().map(|v| ((*k).to_owned(), v)),
                _ => None,
            })
            .collect(),
    )
}

/// The library's host time by kind, in ns, summed over a run's `Record::Busy` spans (in
/// [`HOST_KINDS`] order). Kinds nest (a stalled access includes the remaps it made), so they
/// are not added up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct HostTime([u64; HOST_KINDS.len()]);

/// The kinds of host time a rerun reports, with their JSON names.
const HOST_KINDS: [(BusyKind, &str); 6] = [
    (BusyKind::Stall, "stalled_accesses"),
    (BusyKind::Waited, "other_calls_waited"),
    (BusyKind::RemapIn, "remaps_in"),
    (BusyKind::RemapOut, "remaps_out"),
    (BusyKind::LockWait, "lock_waits"),
    (BusyKind::HostPin, "pinning_host_memory"),
];

impl HostTime {
    fn add(&mut self, kind: BusyKind, ns: u64) {
        if let Some(i) = HOST_KINDS.iter().position(|&(k, _)| k == kind) {
            self.0[i] += ns;
        }
    }

    /// Per iteration: `(self - before) / iterations`, each kind.
    fn per_iteration(&self, before: &HostTime, iterations: u64) -> HostTime {
        let mut out = HostTime::default();
        for (i, v) in out.0.iter_mut().enumerate() {
            *v = self.0[i].saturating_sub(before.0[i]) / iterations.max(1);
        }
        out
    }

    fn scaled(&self, f: impl Fn(u64) -> u64) -> HostTime {
        HostTime(self.0.map(f))
    }
}

/// A run's swap statistics and the library's host time, from its trace.
fn read_trace_figures(trace: &Path) -> Result<(Stats, HostTime), String> {
    let reader = Reader::open(trace)
        .map_err(|e| format!("cannot read the trace {}: {e}", trace.display()))?;
    let mut host = HostTime::default();
    let mut stats = None;
    for record in reader {
        match record {
            Ok(Record::Busy(b)) => host.add(b.kind, b.dur_ns),
            Ok(Record::Stats(s)) => stats = Some(s),
            _ => {}
        }
    }
    stats
        .map(|s| (s, host))
        .ok_or_else(|| format!("the trace {} has no statistics", trace.display()))
}

fn median(values: &[u64]) -> u64 {
    let mut v = values.to_vec();
    v.sort_unstable();
    match v.len() {
        0 => 0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2,
    }
}

/// The setting that caps the host memory a rerun may use (bytes with a unit).
const MEMORY_LIMIT_ENV: &str = "TENSILE_RERUN_MEMORY_LIMIT";

/// Host memory a run may use: `TENSILE_RERUN_MEMORY_LIMIT`, else half of what the kernel calls
/// available (the machine may be shared, and a managed run holds both the device budget and
/// the host pool).
fn host_memory_allowance() -> Result<Option<u64>, String> {
    match std::env::var(MEMORY_LIMIT_ENV) {
        Ok(v) => parse_size(&v, None)
            .map(Some)
            .map_err(|e| format!("{MEMORY_LIMIT_ENV}: {e}")),
        Err(_) => Ok(available_host_memory()),
    }
}

fn available_host_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024 / 2)
}

/// Refuses a footprint that does not fit the allowance, suggesting the scale that would.
fn check_fits(peak: u64, scale: u64, allowance: u64, given: bool) -> Result<(), String> {
    let need = peak.div_ceil(scale);
    if need <= allowance {
        return Ok(());
    }
    let fit = peak.div_ceil(allowance.max(1)).next_power_of_two();
    Err(format!(
        "the trace needs {} at {} (peak {} live); this machine allows {}: use --scale {fit}",
        format_bytes(need),
        if given {
            format!("--scale {scale}")
        } else {
            "full size".to_string()
        },
        format_bytes(peak),
        format_bytes(allowance)
    ))
}

/// `--budget` when neither it nor `--card` is given.
const DEFAULT_BUDGET: &str = "50%";

/// `--time-scale` on the simulated GPU when not given: its own cost per operation (about
/// 100 µs on a 2-core machine: a CPU twin, fresh mappings, thread wake-ups) would otherwise
/// add to the shared traces' kernels, which average 52 µs on ResNet-50; at 16 every shared
/// trace's native step is within 2% of its recorded compute (docs/rerun.md).
const SIMULATED_TIME_SCALE: f64 = 16.0;

/// The shared card `--card` names, checked against the other settings.
fn shared_card(args: &RerunArgs, policies: &[PolicyKind]) -> Result<Option<SharedCard>, String> {
    let Some(name) = &args.card else {
        if args.card_memory.is_some() || args.priority.is_some() {
            return Err("--card-memory and --priority need --card".into());
        }
        return Ok(None);
    };
    if policies != [PolicyKind::Plan] {
        return Err(
            "--card needs --policy plan: only the plan policy joins the coordinator that \
             divides the card"
                .into(),
        );
    }
    let memory = args
        .card_memory
        .as_deref()
        .ok_or("--card needs --card-memory SIZE (the shared card's memory, as played)")?;
    let capacity = parse_size(memory, None).map_err(|e| format!("--card-memory {e}"))?;
    if let Some(p) = &args.priority {
        if tensile_protocol::Priority::parse(p).is_none() {
            return Err(format!("--priority {p:?}: expected high, normal or low"));
        }
    }
    Ok(Some(SharedCard {
        name: name.clone(),
        capacity,
        priority: args.priority.clone(),
        limited: args.budget.is_some(),
    }))
}

fn policies(text: &str) -> Result<Vec<PolicyKind>, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "all" => Ok(vec![PolicyKind::Lru, PolicyKind::Plan]),
        "off" | "none" => Ok(Vec::new()),
        "lru" => Ok(vec![PolicyKind::Lru]),
        "plan" => Ok(vec![PolicyKind::Plan]),
        other => Err(format!(
            "--policy {other:?}: expected plan, lru, off or all"
        )),
    }
}

fn policy_name(p: PolicyKind) -> &'static str {
    match p {
        PolicyKind::Plan => "plan",
        PolicyKind::Lru => "lru",
        PolicyKind::None => "off",
    }
}

/// Whether this machine's own driver has a device (asked in a child, so a broken driver
/// cannot take the command down).
fn real_gpu(pieces: &Pieces) -> bool {
    Command::new(&pieces.tensile)
        .args(["rerun-player", "-", "--probe"])
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn ms(ns: u64) -> String {
    format!("{:.2} ms", ns as f64 / 1e6)
}

/// What `tensile replay` predicts for one policy (per steady-state iteration).
#[derive(Debug, Clone, Copy)]
struct Predicted {
    step_ns: u64,
    bytes_h2d: u64,
    bytes_d2h: u64,
    stall_ns: u64,
}

/// One managed run's figures.
struct ManagedRun {
    policy: PolicyKind,
    step_ns: u64,
    predicted: Option<Predicted>,
    bytes_h2d: u64,
    bytes_d2h: u64,
    stall_ns: u64,
    /// Most device memory the library held at once over the run, at the trace's sizes.
    peak_resident: u64,
    verified: bool,
    stamps_checked: u64,
    failure: Option<String>,
    /// Bytes each way over the whole managed run (prologue, N iterations, final check), at
    /// the trace's sizes.
    run_bytes: (u64, u64),
    /// The plan executor's counters at exit (plan runs).
    executor: Option<BTreeMap<String, u64>>,
    /// The plans the library learned, one line each (plan runs).
    plans_learned: Vec<String>,
    /// The library's host time per steady-state iteration, by kind, in trace time.
    host: HostTime,
    /// Where the simulated card's time went per steady-state iteration, in trace time (on a
    /// GPU: `None`).
    card: Option<card_log::CardTime>,
}

/// What every run of one `tensile rerun` shares: where things are, how it is scaled, and the
/// environment every player starts with.
struct Session {
    pieces: Pieces,
    work: WorkDir,
    script: PathBuf,
    gpu: bool,
    scale: u64,
    time_scale: f64,
    iterations: u32,
    scaled_budget: u64,
    base_env: Vec<(String, String)>,
    card: Option<SharedCard>,
    /// The script played after the first in the same process (`--then`).
    then: Option<PathBuf>,
    /// How the predictions price moves (the planner on the simulated card is told the same).
    cost: CostModel,
    /// `--logs`.
    logs: Option<PathBuf>,
}

impl Session {
    /// Starts the player on the session's script(s); `label` prefixes its progress lines on
    /// stderr.
    fn run_player(
        &self,
        iterations: Option<u32>,
        env: &[(String, String)],
        trace_out: Option<&Path>,
        label: &str,
        log_to: Option<PathBuf>,
    ) -> Result<PlayerOutput, String> {
        let mut cmd = Command::new(&self.pieces.tensile);
        cmd.arg("rerun-player").arg(&self.script);
        if let Some(then) = &self.then {
            cmd.arg("--then").arg(then);
        }
        if let Some(n) = iterations {
            cmd.arg("--iterations").arg(n.to_string());
        }
        cmd.env_remove("LD_PRELOAD");
        for (k, v) in env {
            cmd.env(k, v);
        }
        if let Some(t) = trace_out {
            cmd.env("TENSILE_TRACE", t);
        } else {
            // The fault switch models a broken swap: it applies to managed runs only.
            cmd.env_remove(player::FAULT_ENV);
        }
        let label = label.to_owned();
        let (out, log) = run_echoing(cmd, "the player", move |line| {
            if let Some(progress) = line.strip_prefix("rerun-player: ") {
                eprintln!("  [{label}] {progress}");
            }
        })?;
        if let Some(path) = log_to {
            let mut text = log.join("\n");
            text.push('\n');
            std::fs::write(&path, text)
                .map_err(|e| format!("cannot write the log {}: {e}", path.display()))?;
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let json: Option<Value> = stdout
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l.trim()).ok());
        let stamp_failure = json
            .as_ref()
            .is_some_and(|j| j["verified"] == Value::Bool(false));
        if !out.status.success() && !stamp_failure {
            let tail: Vec<&str> = log
                .iter()
                .rev()
                .take(15)
                .rev()
                .map(String::as_str)
                .collect();
            return Err(format!(
                "the player failed ({}):\n{}",
                out.status,
                tail.join("\n")
            ));
        }
        let json = json.ok_or("the player printed no result")?;
        let (stats, host) = match trace_out {
            Some(t) if !stamp_failure => {
                let (stats, host) = read_trace_figures(t)?;
                (Some(stats), host)
            }
            _ => (None, HostTime::default()),
        };
        let plans_learned = plan_lines(&log);
        Ok(PlayerOutput {
            json,
            stats,
            host,
            executor: executor_line(&log),
            plans_learned,
        })
    }

    /// Where the log of run `name` is kept, if `--logs` asked.
    fn log_path(&self, name: &str) -> Option<PathBuf> {
        self.logs.as_ref().map(|d| d.join(format!("{name}.log")))
    }

    /// Where the library writes the trace of managed run `name`: beside its log with `--logs`,
    /// else in the work directory, removed at the end.
    fn trace_path(&self, name: &str) -> PathBuf {
        self.logs
            .as_ref()
            .unwrap_or(&self.work.path)
            .join(format!("{name}.trace"))
    }

    /// A measured time in trace time.
    fn trace_time(&self, ns: u64) -> u64 {
        (ns as f64 / self.time_scale).round() as u64
    }

    /// The run without the library, of the scripts made from `traces`; the player's result.
    fn native(&self, traces: &[&Trace]) -> Result<Value, String> {
        eprintln!("tensile rerun: native run, without libtensile");
        let mut env = self.base_env.clone();
        if !self.gpu {
            // Not memory-bound: room for every allocation of the run at once (rounded to the
            // simulator's 2 MiB granule), because a stream-ordered free returns memory only
            // when the stream reaches it, and the player may run ahead of the stream. The
            // capacity is only a limit; the simulator maps memory as it is allocated. (A
            // second trace is played after the first's memory is freed.)
            let capacity = traces
                .iter()
                .map(|trace| {
                    trace
                        .allocations
                        .iter()
                        .map(|a| {
                            a.bytes
                                .div_ceil(self.scale)
                                .next_multiple_of(script::PIECE_BYTES)
                        })
                        .sum::<u64>()
                })
                .max()
                .unwrap_or(0)
                + (256 << 20);
            env.extend(simulator_env(capacity, self.scale, self.time_scale));
        }
        let native = self.run_player(None, &env, None, "native", self.log_path("native"))?;
        if native.json["verified"] != Value::Bool(true) {
            let message = native.json["message"].as_str().unwrap_or("stamp mismatch");
            return Err(format!("native run: {message}"));
        }
        Ok(native.json)
    }

    /// Says on stderr that a run under the library with `policy` starts (`what`: what it
    /// plays, if more than the trace).
    fn announce_managed(&self, policy: PolicyKind, what: &str) {
        eprintln!(
            "tensile rerun: under libtensile, TENSILE_POLICY={}, budget {}{what}{}",
            policy_name(policy),
            format_bytes(self.scaled_budget),
            match (&self.card, policy) {
                (Some(card), _) => format!(
                    " at most, on the shared card {:?} (the coordinator {:?} grants the rest)",
                    card.name, card.name
                ),
                (None, PolicyKind::Plan) => {
                    " (learning and planning in the process: TENSILE_COORDINATOR=off)".into()
                }
                (None, _) => String::new(),
            }
        );
    }

    /// The environment of a run under the library with `policy`.
    fn managed_env(&self, policy: PolicyKind) -> Vec<(String, String)> {
        let name = policy_name(policy);
        let mut env = self.base_env.clone();
        env.push((
            "LD_PRELOAD".into(),
            self.pieces.library.display().to_string(),
        ));
        env.push(("TENSILE_POLICY".into(), name.into()));
        env.push((
            "TENSILE_DEVICE_MEMORY".into(),
            self.scaled_budget.to_string(),
        ));
        // The manager's info level brings its counters at exit (swaps cancelled, lock waits;
        // the plan executor's). Under the plan, the planner's announcements are the run's
        // record of when plans came, and with --logs each iteration's account too (what it
        // moved, planned and not). TENSILE_RERUN_LOG adds directives of its own
        // (`tensile_shim::memory=trace`).
        let mut filter = String::from("warn,tensile_shim::managed=info");
        if policy == PolicyKind::Plan {
            filter.push_str(",tensile_shim::planning=info");
            if self.logs.is_some() {
                filter.push_str(",tensile_shim::executor=debug");
            }
        }
        if let Ok(more) = std::env::var("TENSILE_RERUN_LOG") {
            filter.push(',');
            filter.push_str(&more);
        }
        env.push(("TENSILE_LOG".into(), filter));
        if policy == PolicyKind::Plan {
            let coordinator = self.card.as_ref().map_or("off", |c| &c.name);
            env.push(("TENSILE_COORDINATOR".into(), coordinator.into()));
            if !self.gpu {
                env.extend(planner_env(&self.cost, self.scale, self.time_scale));
            }
        }
        match &self.card {
            Some(card) => {
                if !card.limited {
                    env.retain(|(k, _)| k != "TENSILE_DEVICE_MEMORY");
                }
                if let Some(p) = &card.priority {
                    env.push(("TENSILE_PRIORITY".into(), p.clone()));
                }
                env.push(("TENSILE_SIM_CARD".into(), card.name.clone()));
                env.extend(simulator_env(card.capacity, self.scale, self.time_scale));
            }
            None if !self.gpu => {
                env.extend(simulator_env(
                    self.scaled_budget,
                    self.scale,
                    self.time_scale,
                ));
            }
            None => {}
        }
        env
    }

    /// One run under the library, and the baseline run its statistics need.
    fn managed(
        &self,
        policy: PolicyKind,
        predicted: Option<Predicted>,
    ) -> Result<ManagedRun, String> {
        let name = policy_name(policy);
        self.announce_managed(policy, "");
        let mut env = self.managed_env(policy);
        // On the simulated GPU, the card logs what it ran: where the step's time went.
        let card_log = (!self.gpu).then(|| {
            self.trace_path(&format!("{name}-card"))
                .with_extension("log")
        });
        if let Some(path) = &card_log {
            // (The card appends to it.)
            let _ = std::fs::remove_file(path);
            env.push(("TENSILE_SIM_ENGINE_LOG".into(), path.display().to_string()));
        }
        let full_trace = self.trace_path(name);
        let full = self.run_player(None, &env, Some(&full_trace), name, self.log_path(name))?;
        let stamps_checked = full.json["stamps_checked"].as_u64().unwrap_or(0);
        if full.json["verified"] != Value::Bool(true) {
            return Ok(ManagedRun {
                policy,
                step_ns: 0,
                predicted,
                bytes_h2d: 0,
                bytes_d2h: 0,
                stall_ns: 0,
                peak_resident: 0,
                verified: false,
                stamps_checked,
                run_bytes: (0, 0),
                failure: Some(
                    full.json["message"]
                        .as_str()
                        .unwrap_or("stamp mismatch")
                        .to_owned(),
                ),
                executor: full.executor,
                plans_learned: full.plans_learned,
                host: HostTime::default(),
                card: None,
            });
        }
        // The baseline run plays the prologue and one iteration (the prologue alone when N is
        // 1): the difference holds only steady-state iterations, without the first one after
        // the prologue and without the final check of every stamp, which both runs make.
        let card = match &card_log {
            Some(path) => {
                card_log::read(path, self.iterations)?.map(|t| t.scaled(|ns| self.trace_time(ns)))
            }
            None => None,
        };
        env.retain(|(k, _)| k != "TENSILE_SIM_ENGINE_LOG");
        let baseline_iterations = self.iterations.min(2) - 1;
        let baseline_trace = self.trace_path(&format!("{name}-baseline"));
        let baseline = self.run_player(
            Some(baseline_iterations),
            &env,
            Some(&baseline_trace),
            &format!("{name}, baseline of {baseline_iterations} iteration(s)"),
            self.log_path(&format!("{name}-baseline")),
        )?;
        let per_iteration = |f: fn(&Stats) -> u64| {
            let all = full.stats.as_ref().map_or(0, f);
            let before = baseline.stats.as_ref().map_or(0, f);
            all.saturating_sub(before) / u64::from(self.iterations - baseline_iterations)
        };
        Ok(ManagedRun {
            policy,
            step_ns: self.trace_time(median(&steps(&full.json))),
            predicted,
            // Scaled back to the trace's sizes.
            bytes_h2d: per_iteration(|s| s.bytes_to_device) * self.scale,
            bytes_d2h: per_iteration(|s| s.bytes_to_host) * self.scale,
            stall_ns: self.trace_time(per_iteration(|s| s.stall_ns)),
            peak_resident: full.stats.as_ref().map_or(0, |s| s.peak_resident_bytes) * self.scale,
            verified: true,
            stamps_checked,
            failure: None,
            run_bytes: (
                full.stats.as_ref().map_or(0, |s| s.bytes_to_device) * self.scale,
                full.stats.as_ref().map_or(0, |s| s.bytes_to_host) * self.scale,
            ),
            executor: full.executor,
            plans_learned: full.plans_learned,
            host: full
                .host
                .per_iteration(
                    &baseline.host,
                    u64::from(self.iterations - baseline_iterations),
                )
                .scaled(|ns| self.trace_time(ns)),
            card,
        })
    }
}

/// What each policy's prediction prices moves at: the card's copy rates slowed by the
/// remaps of pages in units as that policy's run cuts them (the manager's own units of up to
/// 32 pages under LRU, at most 8 under a plan), with the remap cost per page and the pages per
/// unit it came from. LRU's units are those of the tensors it moves, each counted as often as
/// it moves at the budget (`lru_moves_per_tensor`, priced first by every tensor's units); a
/// plan's, every tensor's (the planner prices moves before it knows which it makes).
struct PolicyCosts {
    lru: CostModel,
    plan: CostModel,
    lru_remap: (PageRemapCost, f64),
    plan_remap: (PageRemapCost, f64),
    /// Whether LRU's units are those of the tensors it moves (else every tensor's).
    lru_by_moves: bool,
}

impl PolicyCosts {
    /// `budget` is the one LRU is predicted at; `lru` whether it is (if not, LRU's units stay
    /// every tensor's and no simulation is spent on them).
    fn new(
        cycle: &Cycle,
        copies: CostModel,
        remaps: RemapModel,
        budget: u64,
        lru: bool,
    ) -> PolicyCosts {
        let remap = |max_unit_pages| {
            let per_unit = cycle.pages_per_unit(CARD_PAGE_BYTES, max_unit_pages);
            (remaps.per_page(per_unit, CARD_PAGE_BYTES), per_unit)
        };
        let plan_remap = remap(SHIM_PLAN_UNIT_PAGES);
        let every = remap(SHIM_MAX_UNIT_PAGES);
        let pages = cycle
            .clone()
            .with_units(MoveUnits::ShimPages)
            .with_page_bytes(CARD_PAGE_BYTES);
        let moved = lru.then(|| {
            lru_moves_per_tensor(
                &pages,
                Budget::new(budget),
                &copies.with_page_remaps(every.0),
            )
        });
        let (lru_remap, lru_by_moves) = match moved {
            Some(Ok(moves)) if moves.iter().any(|&m| m > 0.0) => {
                let per_unit =
                    pages.pages_per_unit_weighted(CARD_PAGE_BYTES, SHIM_MAX_UNIT_PAGES, |t| {
                        moves[t as usize]
                    });
                ((remaps.per_page(per_unit, CARD_PAGE_BYTES), per_unit), true)
            }
            // Not asked for, nothing moves, or LRU does not simulate (which the prediction
            // then says).
            _ => (every, false),
        };
        PolicyCosts {
            lru: copies.with_page_remaps(lru_remap.0),
            plan: copies.with_page_remaps(plan_remap.0),
            lru_remap,
            plan_remap,
            lru_by_moves,
        }
    }

    fn of(&self, policy: PolicyKind) -> &CostModel {
        match policy {
            PolicyKind::Plan => &self.plan,
            _ => &self.lru,
        }
    }
}

/// `tensile replay`'s prediction for each policy (`None` where it has none), on the cycle at
/// the played sizes (the trace's divided by `scale`, in the played page, [`played_page`]),
/// with copies at the played rates, in the units the library moves (`tensile replay
/// --shim-pages`); bytes are reported at trace size. The plan is predicted as the library
/// makes it (whole pages, small tensors left in place), for the budget less the room it
/// leaves free and the partial last pages ([`budgets_to_try`]); LRU as the library's manager
/// runs it (page by page, with its free reserve, the host running ahead).
fn predict(
    analysis: &Analysis,
    policies: &[PolicyKind],
    budget: u64,
    scale: u64,
    costs: &PolicyCosts,
    room: f64,
) -> Vec<(PolicyKind, Option<Predicted>)> {
    let mut played = analysis
        .cycle
        .clone()
        .with_units(MoveUnits::ShimPages)
        .with_page_bytes(played_page(scale));
    for t in &mut played.tensors {
        t.bytes = t.bytes.div_ceil(scale);
    }
    let scaled_cost = |cost: &CostModel| CostModel {
        h2d_gbps: cost.h2d_gbps / scale as f64,
        d2h_gbps: cost.d2h_gbps / scale as f64,
        bidir_gbps: cost.bidir_gbps / scale as f64,
        d2d_gbps: cost.d2d_gbps / scale as f64,
        memset_gbps: cost.memset_gbps / scale as f64,
        // A played page stands for `scale` times fewer bytes of the trace's and is remapped
        // with the same calls.
        remaps: cost.remaps.map(|r| PageRemapCost {
            page_bytes: r.page_bytes.div_ceil(scale),
            ..r
        }),
        ..*cost
    };
    policies
        .iter()
        .map(|&policy| {
            let played_cost = scaled_cost(costs.of(policy));
            let played_budget = budget.div_ceil(scale);
            let budgets = match policy {
                // As the learner plans.
                PolicyKind::Plan => budgets_to_try(&played, played_budget, room),
                // LRU as the library's manager runs it: page by page, with its free reserve
                // and a host that runs ahead (docs/planner.md, "LRU as the shim runs it").
                _ => vec![Budget::new(played_budget)],
            };
            let evaluate = |budget: Budget| {
                evaluate_many_with(
                    &played,
                    &[policy],
                    budget,
                    &played_cost,
                    &BoundOptions::default(),
                    &SearchOptions::default(),
                )
            };
            let mut budgets = budgets.into_iter();
            let mut result = evaluate(budgets.next().expect("at least one budget"));
            while result.is_err() {
                let Some(budget) = budgets.next() else { break };
                result = evaluate(budget);
            }
            let predicted = match result {
                Ok(results) => results.first().map(|r| Predicted {
                    step_ns: r.report.step_ns,
                    bytes_h2d: r.report.bytes_h2d * scale,
                    bytes_d2h: r.report.bytes_d2h * scale,
                    stall_ns: r.report.stall_ns,
                }),
                Err((p, e)) => {
                    eprintln!("tensile rerun: no prediction for {}: {e}", policy_name(p));
                    None
                }
            };
            (policy, predicted)
        })
        .collect()
}

/// One trace as the rerun plays it: what the analyzer finds in it, as the library's learner
/// would plan it.
struct Phase {
    path: PathBuf,
    trace: Trace,
    analysis: Analysis,
}

impl Phase {
    fn load(path: &Path) -> Result<Phase, String> {
        let trace = load(path, LoadOptions::default()).map_err(|e| e.to_string())?;
        let mut analysis = analyze(&trace, &CostModel::default())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        // The plan is predicted as the library's learner makes it: leaving what it cannot name.
        let immovable = tensile_analyzer::exec_plan::unnameable(&trace, &analysis.cycle);
        analysis.cycle = analysis.cycle.with_immovable(immovable);
        Ok(Phase {
            path: path.to_owned(),
            trace,
            analysis,
        })
    }

    /// The steady-state iteration's peak allocated bytes (what a budget in percent is of).
    fn peak(&self) -> u64 {
        self.analysis.footprint.peak_allocated
    }

    /// The file's name, for tables.
    fn name(&self) -> String {
        let name = self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        name.trim_end_matches(".gz")
            .trim_end_matches(".trace")
            .to_owned()
    }
}

/// The line that says what a script plays.
fn describe_script(phase: &Phase, script: &script::Script, gpu: bool, iterations: u32) -> String {
    format!(
        "tensile rerun: {} on {}: prologue of {} steps, then {}{} iterations of {} ops ({} \
         stand-in launches each) on {} stream(s) besides the legacy default stream",
        phase.path.display(),
        if gpu {
            "this machine's GPU"
        } else {
            "the simulated GPU"
        },
        script.prologue.len(),
        match script.warmup {
            0 => String::new(),
            w => format!("{w} to warm up (for the recorded steps after the first) and "),
        },
        iterations,
        phase.analysis.cycle.len(),
        script.kernels_per_iteration(),
        script.streams
    )
}

/// Runs `tensile rerun`.
pub fn run(args: RerunArgs) -> Result<(), String> {
    if args.iterations == 0 {
        return Err("--iterations must be at least 1".into());
    }
    if let Some(k) = args.time_scale.filter(|k| !(k.is_finite() && *k > 0.0)) {
        return Err(format!("--time-scale {k}: must be a positive number"));
    }
    if args.scale == Some(0) {
        return Err("--scale must be at least 1".into());
    }
    if args.then.is_some() && args.card.is_some() {
        return Err("--then does not take --card: a rerun that switches traces plays alone".into());
    }
    let scale = args.scale.unwrap_or(1);
    let policies = policies(&args.policy)?;
    let pieces = find_pieces()?;
    let first = Phase::load(&args.trace)?;
    let then = args.then.as_deref().map(Phase::load).transpose()?;
    // Pages move at the copy rates slowed by the driver's remap cost per page, on the card
    // (docs/gpu-results.md) and on the simulated GPU alike (it charges the same per call):
    // the library planner's own default, for the TENSILE_SWAPPED and TENSILE_HOST_UNITS the
    // runs inherit.
    let config = tensile_shim::config::Config::from_env().0;
    let remaps = tensile_shim::planning::page_remaps(config.swapped_unmapped, config.host_frames);
    let copies = CostModel::default();
    let (trace, analysis) = (&first.trace, &first.analysis);
    let peak = first.peak();
    let card = shared_card(&args, &policies)?;
    let budget = match (&args.budget, &card) {
        (Some(b), _) => parse_size(b, Some(peak)).map_err(|e| format!("--budget {e}"))?,
        // The job alone on the shared card: what the prediction is made for.
        (None, Some(card)) => card.capacity * scale,
        (None, None) => parse_size(DEFAULT_BUDGET, Some(peak)).expect("the default parses"),
    };
    // Per page, the calls' per-mapping terms are shared by the pages of a unit: units the size
    // of this trace's tensors, as each policy's run cuts them (`Cycle::pages_per_unit`).
    let costs_of = |phase: &Phase| {
        PolicyCosts::new(
            &phase.analysis.cycle,
            copies,
            remaps,
            budget,
            policies.contains(&PolicyKind::Lru),
        )
    };
    let costs = costs_of(&first);
    if let Some(allowance) = host_memory_allowance()? {
        // A second trace plays after the first's memory is freed.
        let whole_peak = std::iter::once(&first)
            .chain(&then)
            .map(|p| script::peak_live_bytes(&p.trace, 1, 1))
            .max()
            .unwrap_or(0);
        check_fits(whole_peak, scale, allowance, args.scale.is_some())?;
    }
    let gpu = !args.simulated && card.is_none() && real_gpu(&pieces);
    let time_scale = args
        .time_scale
        .unwrap_or(if gpu { 1.0 } else { SIMULATED_TIME_SCALE });
    if args.time_scale.is_none() && !gpu {
        eprintln!(
            "tensile rerun: on the simulated GPU, time scale {SIMULATED_TIME_SCALE} (its own cost \
             per operation would add to every short kernel; --time-scale 1 plays the recorded \
             times as they are)"
        );
    }
    let scaled_budget = budget.div_ceil(scale);
    let scaling = Scaling {
        size_divisor: scale,
        time_scale,
        max_slots: Scaling::slots_for_budget((!policies.is_empty()).then_some(scaled_budget)),
    };
    let script = script::build(trace, analysis, &copies, scaling, args.iterations);
    // The second trace's kernels are other kernels than the first's (another program).
    let then_script = then.as_ref().map(|p| {
        let mut s = script::build(&p.trace, &p.analysis, &copies, scaling, args.iterations);
        s.offset_kernels(script.kernel_bound());
        s
    });
    if let Some(dir) = &args.logs {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot make the log directory {}: {e}", dir.display()))?;
    }
    let work = WorkDir::new("rerun", &pieces.simulator, false)?;
    let script_path = work.path.join("script.json");
    let text = serde_json::to_string(&script).map_err(|e| e.to_string())?;
    std::fs::write(&script_path, text)
        .map_err(|e| format!("cannot write {}: {e}", script_path.display()))?;
    eprintln!("{}", describe_script(&first, &script, gpu, args.iterations));
    let then_path = match (&then, &then_script) {
        (Some(phase), Some(s)) => {
            let path = work.path.join("then.json");
            let text = serde_json::to_string(s).map_err(|e| e.to_string())?;
            std::fs::write(&path, text)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            eprintln!(
                "{}, after the first in the same process",
                describe_script(phase, s, gpu, args.iterations)
            );
            Some(path)
        }
        _ => None,
    };
    if scale > 1 {
        eprintln!(
            "tensile rerun: --scale {scale}: sizes, the budget ({} -> {}) and the modelled \
             copy bandwidth ({PCIE_GBPS} -> {:.3} GB/s) divided by {scale}; the simulated page \
             {} (2 MiB on the card); the stamp piece stays {}",
            format_bytes(budget),
            format_bytes(scaled_budget),
            PCIE_GBPS / scale as f64,
            format_bytes(played_page(scale)),
            format_bytes(script.piece_bytes),
        );
    }
    let mut base_env: Vec<(String, String)> = Vec::new();
    if !gpu {
        base_env.push(("LD_LIBRARY_PATH".into(), work.path.display().to_string()));
    }
    let session = Session {
        pieces,
        script: script_path,
        work,
        gpu,
        scale,
        time_scale,
        iterations: args.iterations,
        scaled_budget,
        base_env,
        card,
        then: then_path,
        cost: costs.plan,
        logs: args.logs.clone(),
    };

    // The players inherit TENSILE_PLAN_ROOM: the prediction plans as they will.
    let (room, problem) = room_from_env(|k| std::env::var(k).ok());
    if let Some(problem) = problem {
        return Err(problem);
    }
    let lru_units = if costs.lru_by_moves {
        "of the tensors it moves"
    } else {
        "of every tensor"
    };
    for (policy, (remap, per_unit), whose, how) in [
        (
            "lru",
            costs.lru_remap,
            lru_units,
            "in on the thread that queues the copy, out after the copy by the thread that completes the swap-out",
        ),
        (
            "plan",
            costs.plan_remap,
            "of every tensor",
            "beside the copies, on the executor's threads",
        ),
    ] {
        eprintln!(
            "tensile rerun: {policy}'s prediction charges remapping {:.1} µs per 2 MiB page in \
             and {:.1} out, {how} (the H100's VMM calls, shared by units of {per_unit:.1} \
             pages on average, {whose})",
            remap.in_ns as f64 / 1e3,
            remap.out_ns as f64 / 1e3
        );
    }
    if let Some(then) = &then {
        let phases = [
            switch::Played {
                phase: &first,
                costs: &costs,
            },
            switch::Played {
                phase: then,
                costs: &costs_of(then),
            },
        ];
        return switch::run(&args, &session, &phases, &policies, budget, room);
    }
    if args.predict_only {
        let predicted = predict(analysis, &policies, budget, scale, &costs, room);
        print_predictions(&args, budget, scale, &predicted)?;
        return Ok(());
    }
    let (native_step_ns, native) = if session.card.is_some() {
        eprintln!("tensile rerun: --card: no native run");
        (0, Value::Null)
    } else {
        let native = session.native(&[trace])?;
        (session.trace_time(median(&steps(&native))), native)
    };
    let mut runs = predict(analysis, &policies, budget, scale, &costs, room)
        .into_iter()
        .map(|(policy, predicted)| session.managed(policy, predicted))
        .collect::<Result<Vec<_>, _>>()?;
    // The learner adapts the room its plans leave to what the run shows (unless
    // TENSILE_PLAN_ROOM fixes it): the plan is predicted as the run ended up making it.
    for run in runs.iter_mut().filter(|r| r.policy == PolicyKind::Plan) {
        let Some(ended) = final_room(&run.plans_learned).filter(|r| (r - room).abs() > 1e-9) else {
            continue;
        };
        eprintln!(
            "tensile rerun: the plan run ended leaving {:.0}% of the budget free (it started \
             at {:.0}%): the plan is predicted at that room",
            ended * 100.0,
            room * 100.0
        );
        if let Some((_, predicted)) =
            predict(analysis, &[PolicyKind::Plan], budget, scale, &costs, ended).pop()
        {
            run.predicted = predicted;
        }
    }

    if args.json {
        let doc = json!({
            "trace": args.trace.display().to_string(),
            "iterations": args.iterations,
            "time_scale": time_scale,
            "scale": scale,
            "budget_bytes": budget,
            "remaps": {
                "lru": {
                    "in_ns_per_page": costs.lru_remap.0.in_ns,
                    "out_ns_per_page": costs.lru_remap.0.out_ns,
                    "pages_per_unit": costs.lru_remap.1,
                },
                "plan": {
                    "in_ns_per_page": costs.plan_remap.0.in_ns,
                    "out_ns_per_page": costs.plan_remap.0.out_ns,
                    "pages_per_unit": costs.plan_remap.1,
                },
            },
            "native_step_ns": native_step_ns,
            "native_stamps_checked": native["stamps_checked"].as_u64().unwrap_or(0),
            "compute_ns": analysis.cycle.compute_ns(),
            "device": if gpu { "gpu" } else { "simulated" },
            "runs": runs.iter().map(run_json).collect::<Vec<_>>(),
        });
        print_json(&doc)?;
    } else {
        print!(
            "{}",
            human(
                &args,
                time_scale,
                analysis,
                budget,
                native_step_ns,
                &native,
                &runs
            )
        );
    }
    failed_runs(runs.iter().map(|r| (r.policy, r.failure.as_deref())))
}

/// The command's result: an error naming each run that failed (`(policy, failure)`).
fn failed_runs<'a>(
    runs: impl Iterator<Item = (PolicyKind, Option<&'a str>)>,
) -> Result<(), String> {
    let failures: Vec<String> = runs
        .filter_map(|(policy, failure)| {
            failure.map(|m| format!("{} run: {m}", policy_name(policy)))
        })
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

/// Prints `doc` as the one JSON object of `--json`.
fn print_json(doc: &Value) -> Result<(), String> {
    println!(
        "{}",
        serde_json::to_string_pretty(doc).map_err(|e| e.to_string())?
    );
    Ok(())
}

/// Each policy's prediction, as `--predict-only --json` prints it.
fn predictions_json(predicted: &[(PolicyKind, Option<Predicted>)]) -> Value {
    predicted
        .iter()
        .map(|(policy, p)| {
            json!({
                "policy": policy_name(*policy),
                "step_ns": p.map(|p| p.step_ns),
                "bytes_h2d": p.map(|p| p.bytes_h2d),
                "bytes_d2h": p.map(|p| p.bytes_d2h),
                "stall_ns": p.map(|p| p.stall_ns),
            })
        })
        .collect()
}

/// `--predict-only`: each policy's prediction, as a table or (`--json`) one object.
fn print_predictions(
    args: &RerunArgs,
    budget: u64,
    scale: u64,
    predicted: &[(PolicyKind, Option<Predicted>)],
) -> Result<(), String> {
    if args.json {
        let doc = json!({
            "trace": args.trace.display().to_string(),
            "scale": scale,
            "budget_bytes": budget,
            "predictions": predictions_json(predicted),
        });
        print_json(&doc)?;
        return Ok(());
    }
    println!(
        "{:<8} {:>12} {:>11} {:>11} {:>12}",
        "policy", "predicted", "H2D/iter", "D2H/iter", "stall/iter"
    );
    for &(policy, p) in predicted {
        match p {
            Some(p) => println!(
                "{:<8} {:>12} {:>11} {:>11} {:>12}",
                policy_name(policy),
                ms(p.step_ns),
                format_bytes(p.bytes_h2d),
                format_bytes(p.bytes_d2h),
                ms(p.stall_ns)
            ),
            None => println!("{:<8} no prediction", policy_name(policy)),
        }
    }
    Ok(())
}

fn run_json(r: &ManagedRun) -> Value {
    json!({
        "policy": policy_name(r.policy),
        "step_ns": r.step_ns,
        "predicted_ns": r.predicted.map(|p| p.step_ns),
        "predicted": r.predicted.map(|p| json!({
            "bytes_h2d": p.bytes_h2d,
            "bytes_d2h": p.bytes_d2h,
            "stall_ns": p.stall_ns,
        })),
        "bytes_h2d": r.bytes_h2d,
        "bytes_d2h": r.bytes_d2h,
        "stall_ns": r.stall_ns,
        "peak_resident_bytes": r.peak_resident,
        "verified": r.verified,
        "stamps_checked": r.stamps_checked,
        "failure": r.failure,
        "run_bytes_h2d": r.run_bytes.0,
        "run_bytes_d2h": r.run_bytes.1,
        "executor": r.executor,
        "plans_learned": r.plans_learned,
        "host_ns": HOST_KINDS
            .iter()
            .zip(r.host.0)
            .map(|(&(_, name), ns)| (name.to_string(), json!(ns)))
            .collect::<serde_json::Map<String, Value>>(),
        "card": r.card.map(|c| json!({
            "compute_ns": c.compute_ns,
            "idle_for_host_ns": c.idle_host_ns,
            "idle_for_copies_ns": c.idle_copies_ns,
            "h2d_busy_ns": c.h2d_busy_ns,
            "d2h_busy_ns": c.d2h_busy_ns,
        })),
    })
}

fn steps(json: &Value) -> Vec<u64> {
    json["steps_ns"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

fn human(
    args: &RerunArgs,
    time_scale: f64,
    analysis: &Analysis,
    budget: u64,
    native_step_ns: u64,
    native: &Value,
    runs: &[ManagedRun],
) -> String {
    let mut out = String::new();
    let compute = analysis.cycle.compute_ns();
    let _ = writeln!(
        out,
        "trace      {} ({} iterations of {} ops played after the prologue; time scale {}, \
         scale {})",
        args.trace.display(),
        args.iterations,
        analysis.cycle.len(),
        time_scale,
        args.scale.unwrap_or(1)
    );
    if let Some(card) = &args.card {
        let _ = writeln!(
            out,
            "native     not run (--card {card}); recorded compute {} per iteration",
            ms(compute)
        );
    } else {
        let _ = writeln!(
            out,
            "native     step {} (median, trace time); recorded compute {} per iteration \
             ({:+.1}%); {} stamps checked",
            ms(native_step_ns),
            ms(compute),
            (native_step_ns as f64 / compute.max(1) as f64 - 1.0) * 100.0,
            native["stamps_checked"].as_u64().unwrap_or(0)
        );
    }
    let _ = writeln!(
        out,
        "budget     {} ({:.1}% of the steady state's peak {})",
        format_bytes(budget),
        budget as f64 * 100.0 / analysis.footprint.peak_allocated.max(1) as f64,
        format_bytes(analysis.footprint.peak_allocated)
    );
    if runs.is_empty() {
        return out;
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "{:<14} {:>12} {:>11} {:>11} {:>12} {:>11} {:>10}  stamps",
        "policy", "step", "H2D/iter", "D2H/iter", "stall/iter", "peak res.", "checked"
    );
    for r in runs {
        let _ = writeln!(
            out,
            "{:<14} {:>12} {:>11} {:>11} {:>12} {:>11} {:>10}  {}",
            format!("{} measured", policy_name(r.policy)),
            if r.verified {
                ms(r.step_ns)
            } else {
                "-".into()
            },
            format_bytes(r.bytes_h2d),
            format_bytes(r.bytes_d2h),
            ms(r.stall_ns),
            format_bytes(r.peak_resident),
            r.stamps_checked,
            match &r.failure {
                None => "verified".to_string(),
                Some(m) => format!("FAILED: {m}"),
            }
        );
        match r.predicted {
            Some(p) => {
                let _ = writeln!(
                    out,
                    "{:<14} {:>12} {:>11} {:>11} {:>12}",
                    format!("{} predicted", policy_name(r.policy)),
                    ms(p.step_ns),
                    format_bytes(p.bytes_h2d),
                    format_bytes(p.bytes_d2h),
                    ms(p.stall_ns),
                );
            }
            None => {
                let _ = writeln!(out, "{} predicted: no prediction", policy_name(r.policy));
            }
        }
    }
    for r in runs
        .iter()
        .filter(|r| r.verified && r.host != HostTime::default())
    {
        let kinds: Vec<String> = HOST_KINDS
            .iter()
            .zip(r.host.0)
            .map(|(&(kind, _), ns)| format!("{} {}", busy_name(kind), ms(ns)))
            .collect();
        let _ = writeln!(
            out,
            "host       {} per iteration, the library's threads included (spans nest): {}",
            policy_name(r.policy),
            kinds.join(", ")
        );
    }
    for r in runs.iter().filter(|r| r.verified) {
        if let Some(c) = r.card {
            let _ = writeln!(
                out,
                "card       {} per iteration: compute {}; idle waiting for the host {}, for \
                 copies {}; copy engines busy {} to the device, {} to the host",
                policy_name(r.policy),
                ms(c.compute_ns),
                ms(c.idle_host_ns),
                ms(c.idle_copies_ns),
                ms(c.h2d_busy_ns),
                ms(c.d2h_busy_ns)
            );
        }
    }
    for r in runs.iter().filter(|r| r.policy == PolicyKind::Plan) {
        let _ = writeln!(
            out,
            "plan       {} plan(s) learned in the process",
            r.plans_learned
                .iter()
                .filter(|l| l.contains(" learned: "))
                .count()
        );
        for line in &r.plans_learned {
            let _ = writeln!(out, "           {line}");
        }
        match &r.executor {
            Some(e) => {
                let get = |k: &str| e.get(k).copied().unwrap_or(0);
                let _ = writeln!(
                    out,
                    "executor   {} steps done, {} skipped, {} dropped, {} failed; {} mismatches, \
                     {} plans dropped; {} pages out ({} named by the plan, {} more with their \
                     units, {} of them dead), {} in",
                    get("steps_done"),
                    get("steps_skipped"),
                    get("steps_dropped"),
                    get("steps_failed"),
                    get("mismatches"),
                    get("plans_dropped"),
                    get("pages_out"),
                    get("out_named"),
                    get("out_unit_live") + get("out_unit_dead"),
                    get("out_unit_dead"),
                    get("pages_in")
                );
                let _ = writeln!(
                    out,
                    "unplanned  the manager's own choice, in pages: {} out for launches, {} for \
                     prefetches, {} for new allocations, {} kept free ahead, {} for the budget; \
                     {} in on demand",
                    get("unplanned_out_access"),
                    get("unplanned_out_prefetch"),
                    get("unplanned_out_allocation"),
                    get("unplanned_out_reserve"),
                    get("unplanned_out_budget"),
                    get("in_on_demand"),
                );
            }
            None => {
                let _ = writeln!(out, "executor   no plan ran (swapped on demand throughout)");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_footprint_over_the_allowance_is_refused_with_the_scale_that_fits() {
        let gib = 1u64 << 30;
        assert!(check_fits(4 * gib, 1, 8 * gib, false).is_ok());
        let err = check_fits(10 * gib, 1, 3 * gib, false).unwrap_err();
        assert!(err.contains("--scale 4"), "{err}");
        assert!(err.contains("full size"), "{err}");
        let err = check_fits(10 * gib, 2, 3 * gib, true).unwrap_err();
        assert!(
            err.contains("at --scale 2") && err.contains("use --scale 4"),
            "{err}"
        );
        assert!(check_fits(10 * gib, 4, 3 * gib, true).is_ok());
    }

    #[test]
    fn the_played_page_shrinks_with_the_scale_to_a_power_of_two_the_simulator_takes() {
        const KIB: u64 = 1 << 10;
        assert_eq!(played_page(1), 2048 * KIB);
        assert_eq!(played_page(4), 512 * KIB);
        assert_eq!(played_page(3), 512 * KIB);
        assert_eq!(played_page(32), 64 * KIB);
        assert_eq!(played_page(1000), 64 * KIB);
        // VMM time: K where the page shrank by all of the scale, more where it could not.
        let vmm = |scale| {
            simulator_env(1 << 30, scale, 16.0)
                .into_iter()
                .find(|(k, _)| k == "TENSILE_SIM_VMM_TIME")
                .map(|(_, v)| v.parse::<f64>().unwrap())
                .unwrap()
        };
        assert_eq!(vmm(4), 16.0);
        assert_eq!(vmm(3), 12.0);
        assert_eq!(vmm(64), 32.0);
    }

    #[test]
    fn the_executors_exit_line_reads_as_pairs() {
        let log = vec![
            "something else".to_owned(),
            "tensile: plan executor: plans_loaded 2 plans_dropped 1 mismatches 1 steps_done 40"
                .to_owned(),
        ];
        let e = executor_line(&log).unwrap();
        assert_eq!(e["plans_loaded"], 2);
        assert_eq!(e["mismatches"], 1);
        assert_eq!(e["steps_done"], 40);
        assert_eq!(executor_line(&log[..1]), None);
    }

    #[test]
    fn the_room_a_run_ended_with_is_its_last_change() {
        let change = |percent: u32| {
            format!(
                "INFO tensile_shim::planning: tensile: plans now leave {percent}% of the budget \
                 free (the manager evicted 31% as many pages of its own choice as the plan \
                 moved out over an iteration); planning again"
            )
        };
        let log = vec![
            "INFO tensile: plan 1 learned: 222 launches per iteration".to_owned(),
            change(30),
            "INFO tensile: plan 2 learned: 222 launches per iteration".to_owned(),
            change(40),
        ];
        let lines = plan_lines(&log);
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(lines[1].starts_with(ROOM_LINE), "{}", lines[1]);
        assert_eq!(final_room(&lines), Some(0.4));
        assert_eq!(final_room(&lines[..1]), None);
    }

    #[test]
    fn a_plan_dropped_at_the_final_check_is_said_to_be_after_the_last_iteration() {
        let dropped = |kernel: u32| {
            format!(
                "WARN tensile: plan 1 dropped at launch 2097 (position 35 of 222): expected \
                 kernel `tensile_rerun_op_k5`, got `tensile_rerun_op_k{kernel}`; swapping on \
                 demand until a new plan"
            )
        };
        let log = vec![
            "INFO tensile: plan 1 learned: 222 launches per iteration".to_owned(),
            "INFO tensile: something else".to_owned(),
            dropped(7),
            dropped(script::FINAL_CHECK_KERNEL),
        ];
        let lines = plan_lines(&log);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].starts_with("plan 1 learned: "));
        assert!(!lines[1].contains("final check"), "{}", lines[1]);
        assert!(
            lines[2].contains(
                "k4294967292` (the final check of every stamp, after the last \
                               iteration); swapping"
            ),
            "{}",
            lines[2]
        );
    }

    #[test]
    fn policy_names_as_the_issue_gives_them() {
        assert_eq!(
            policies("all").unwrap(),
            [PolicyKind::Lru, PolicyKind::Plan]
        );
        assert!(policies("off").unwrap().is_empty());
        assert_eq!(policies("LRU").unwrap(), [PolicyKind::Lru]);
        assert!(policies("fifo").unwrap_err().contains("fifo"));
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[5, 1, 3]), 3);
        assert_eq!(median(&[4, 1, 3, 2]), 2);
        assert_eq!(median(&[]), 0);
    }
}
