//! `tensile trace-info FILE`: what a trace holds, in one screen; `--timeline` draws it.
//!
//! Reads every format `tensile replay` reads: libtensile's own traces (streamed by `native`,
//! with the interposer's own figures and the swap statistics) and capture v1 files (loaded
//! through `tensile_analyzer::import` and summarized by `model`), gzipped or not. A cut trace
//! is summarized up to the cut and says so; a foreign file is refused with the importer's
//! message. The timeline (`timeline`) is written from the analyzer's model for both formats.

mod library;
mod model;
mod native;
mod timeline;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use tensile_analyzer::import::{load, LoadError, LoadOptions};
use tensile_analyzer::model::SourceFormat;
use tensile_analyzer::Trace;
use tensile_trace::{Reader, TraceError, MAGIC};

pub use library::{busy_name, LibraryWork};
pub use native::TraceSummary;

/// Arguments of `tensile trace-info`.
#[derive(clap::Args)]
pub struct TraceInfoArgs {
    /// A trace: libtensile's own (TENSILE_TRACE) or a capture v1 file, gzipped or not.
    pub trace: PathBuf,
    /// How many kernels to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Also write the recorded run as a timeline for Perfetto (ui.perfetto.dev) or
    /// chrome://tracing: Chrome trace-event JSON, kernels and copies per stream, host waits,
    /// allocated bytes, and the library's swaps, stalls, remaps and plans.
    #[arg(long, value_name = "OUT.json")]
    pub timeline: Option<PathBuf>,
}

/// Runs `tensile trace-info`.
pub fn run(args: TraceInfoArgs) -> Result<(), String> {
    print!("{}", render(&args)?);
    Ok(())
}

/// Does the work of `tensile trace-info` and returns what it prints.
fn render(args: &TraceInfoArgs) -> Result<String, String> {
    let path = &args.trace;
    let mut out = String::new();
    let (stats, library, mut loaded) = if is_native(path)? {
        let summary = native_report(path, args.top, &mut out)?;
        (summary.stats, summary.library, None)
    } else {
        let (trace, cut) = load_model(path)?;
        out.push_str(&format!(
            "trace:    {}\nformat:   {}\n",
            path.display(),
            format_name(trace.format)
        ));
        match cut {
            Some(LoadError::Truncated { at, what, .. }) => out.push_str(&format!(
                "state:    truncated at {at}: {what}; summarized up to the cut\n"
            )),
            Some(e) => out.push_str(&format!("state:    {e}\n")),
            None if !trace.complete => out.push_str("state:    no end marker\n"),
            None => {}
        }
        out.push_str(&model::report(&trace, args.top));
        (Vec::new(), LibraryWork::default(), Some(trace))
    };
    if let Some(target) = &args.timeline {
        let trace = match loaded.take() {
            Some(trace) => trace,
            None => load_model(path)?.0,
        };
        let events = timeline::build(&trace, &stats, &library);
        events.write(target)?;
        out.push_str(&format!(
            "timeline: {} events written to {} (open it in ui.perfetto.dev or chrome://tracing)\n",
            events.len(),
            target.display()
        ));
    }
    Ok(out)
}

/// Whether `path` is in libtensile's own format (its magic bytes, after gunzip if gzipped).
/// Anything else, unreadable gzip included, goes to the importer, which names the problem.
fn is_native(path: &Path) -> Result<bool, String> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut input = BufReader::new(file);
    let gzipped = input
        .fill_buf()
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .starts_with(&[0x1f, 0x8b]);
    let mut head = Vec::with_capacity(MAGIC.len());
    let read = if gzipped {
        flate2::read::MultiGzDecoder::new(input)
            .take(MAGIC.len() as u64)
            .read_to_end(&mut head)
    } else {
        input.take(MAGIC.len() as u64).read_to_end(&mut head)
    };
    Ok(read.is_ok() && head == MAGIC)
}

/// The streamed report of a native trace, appended to `out`; returns the summary.
fn native_report(path: &Path, top: usize, out: &mut String) -> Result<TraceSummary, String> {
    let reader = Reader::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let header = reader.header().clone();
    let mut summary = TraceSummary::default();
    let mut ending = None;
    for record in reader {
        match record {
            Ok(record) => summary.add(&record),
            Err(e) => {
                ending = Some(e);
                break;
            }
        }
    }
    out.push_str(&format!(
        "trace:    {}\nformat:   tensile\nproducer: {}  pid {}\ncommand:  {}\n",
        path.display(),
        header.producer,
        header.pid,
        header.command
    ));
    match &ending {
        None if summary.ended() => {}
        None => out.push_str("state:    no end marker (the process did not exit cleanly)\n"),
        Some(e @ TraceError::Truncated { .. }) => out.push_str(&format!("state:    {e}\n")),
        Some(e) => return Err(format!("{}: {e}", path.display())),
    }
    out.push_str(&summary.report(top));
    Ok(summary)
}

/// Loads a trace into the analyzer's model; a cut file is loaded up to the cut, and the
/// second value says where it was cut.
fn load_model(path: &Path) -> Result<(Trace, Option<LoadError>), String> {
    match load(path, LoadOptions::default()) {
        Ok(trace) => Ok((trace, None)),
        Err(cut @ LoadError::Truncated { .. }) => {
            let options = LoadOptions {
                allow_truncated: true,
            };
            let trace = load(path, options).map_err(|e| e.to_string())?;
            Ok((trace, Some(cut)))
        }
        Err(e) => Err(e.to_string()),
    }
}

fn format_name(format: SourceFormat) -> &'static str {
    match format {
        SourceFormat::CaptureV1 => "capture v1",
        SourceFormat::Tensile => "tensile",
    }
}

/// `part` as a percentage of `whole` ("-" for none).
pub(crate) fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".to_string()
    } else {
        format!("{:.5}%", 100.0 * part as f64 / whole as f64)
    }
}

/// Launches of one kernel and their GPU time (over the launches that have one).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct KernelStats {
    pub launches: u64,
    pub gpu_ns: u64,
    pub timed: u64,
}

impl KernelStats {
    pub fn time(&mut self, gpu_ns: u64) {
        self.gpu_ns += gpu_ns;
        self.timed += 1;
    }
}

/// The report's kernel table: the `top` kernels by GPU time, or by launch count when no launch
/// has a GPU time; ties in kernel id order.
pub(crate) fn write_top_kernels<'a>(
    out: &mut String,
    kernels: &HashMap<u32, KernelStats>,
    name: impl Fn(u32) -> Option<&'a str>,
    top: usize,
) {
    let mut kernels: Vec<_> = kernels.iter().collect();
    let timed = kernels.iter().any(|(_, k)| k.timed > 0);
    kernels.sort_by(|a, b| {
        let key = |k: &KernelStats| if timed { k.gpu_ns } else { k.launches };
        key(b.1).cmp(&key(a.1)).then(a.0.cmp(b.0))
    });
    let _ = writeln!(
        out,
        "top kernels by {}:",
        if timed {
            "GPU time"
        } else {
            "launch count (no GPU times recorded)"
        }
    );
    let _ = writeln!(
        out,
        "  {:>10} {:>12} {:>10}  name",
        "launches", "gpu total", "mean"
    );
    for (&id, k) in kernels.into_iter().take(top) {
        let (total, mean) = match k.gpu_ns.checked_div(k.timed) {
            Some(mean) => (ms(k.gpu_ns), ms(mean)),
            None => ("-".into(), "-".into()),
        };
        let name = name(id).unwrap_or("?");
        let _ = writeln!(
            out,
            "  {:>10} {:>12} {:>10}  {name}",
            k.launches, total, mean
        );
    }
}

/// Milliseconds with three decimals.
pub(crate) fn ms(ns: u64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

/// Bytes with a binary unit.
pub(crate) fn bytes(n: u64) -> String {
    tensile_analyzer::cost::format_bytes(n)
}

#[cfg(test)]
mod tests;
