//! The trace recorder (`TENSILE_TRACE`): hooks hand records to a bounded queue, and one
//! background thread writes them with `tensile_trace::Writer`.
//!
//! - The header is written before [`Recorder::start`] returns, so an unwritable path is an
//!   error at start, not a silent empty trace.
//! - A hook never waits long: when the queue is full it waits at most [`SEND_PATIENCE`],
//!   then drops the record and counts it; the count is logged and written in the trace's
//!   `End` record.
//! - The writer flushes at least every [`FLUSH_INTERVAL`], so a process that crashes leaves
//!   a trace that reads back up to its last complete record.
//! - [`Recorder::finish`] (called at exit) writes the `Stats` and `End` records and waits
//!   for the file to be complete.
//!
//! [`RecordSink`] is what the hooks hand records to: the trace file (if any) and the record
//! tap, a bounded queue the in-process planner drains (under `TENSILE_POLICY=plan`). The tap
//! carries records only once its consumer took it ([`RecordSink::take_tap`]): until then no
//! record is built for it. A full tap drops the record and counts it; it never blocks a hook.
//!
//! This module decides nothing about what is recorded; the hooks do.

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam::channel::{self, SendTimeoutError, Sender, TrySendError};
use tensile_trace::{
    Busy, BusyKind, End, Header, Record, Stats, Swap, SwapCause, SwapDir, Writer, FORMAT_VERSION,
};

use crate::memory::Journal;

/// Records that may wait in the queue.
pub const QUEUE_CAPACITY: usize = 1 << 16;
/// How long a hook waits for room in a full queue before dropping its record.
pub const SEND_PATIENCE: Duration = Duration::from_millis(20);
/// The longest a written record stays in the writer's buffer.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(50);

/// How long a consumer of the hooks' records (the trace writer, the planning thread) sleeps
/// when it finds none, at first. Consumers poll rather than block in the channel: a sender
/// that finds its receiver blocked must wake it, a futex call on the launch path. Measured on
/// the 2-core machine with sends 20 and 40 µs apart (a training step's launches are 20 to
/// 40 µs apart): 4.9 and 8.7 µs per send to a blocked receiver, 0.18 and 0.23 µs to one that
/// polls (`tests::send_cost_to_a_blocked_and_to_a_polling_consumer`, docs/interposition.md).
pub const CONSUMER_NAP: Duration = Duration::from_millis(1);
/// The longest nap, reached by doubling while nothing comes: an idle process's consumers wake
/// about 125 times a second, not 1,000.
pub const CONSUMER_NAP_MAX: Duration = Duration::from_millis(8);

/// What [`Poller::next`] found.
pub enum Polled<T> {
    Message(T),
    /// Nothing, after a nap.
    Nothing,
    /// Every sender is gone.
    Gone,
}

/// Takes messages from a channel without ever blocking in it: when there is none, it naps,
/// from [`CONSUMER_NAP`] doubling up to [`CONSUMER_NAP_MAX`] while none comes.
pub struct Poller {
    nap: Duration,
}

impl Poller {
    pub fn new() -> Poller {
        Poller { nap: CONSUMER_NAP }
    }

    /// The next message of `rx`, or [`Polled::Nothing`] after a nap.
    pub fn next<T>(&mut self, rx: &channel::Receiver<T>) -> Polled<T> {
        match rx.try_recv() {
            Ok(m) => {
                self.nap = CONSUMER_NAP;
                Polled::Message(m)
            }
            Err(channel::TryRecvError::Empty) => {
                std::thread::sleep(self.nap);
                self.nap = (self.nap * 2).min(CONSUMER_NAP_MAX);
                Polled::Nothing
            }
            Err(channel::TryRecvError::Disconnected) => Polled::Gone,
        }
    }
}

impl Default for Poller {
    fn default() -> Self {
        Self::new()
    }
}

/// How long [`Recorder::finish`] waits for the writer to close the file.
pub const FINISH_PATIENCE: Duration = Duration::from_secs(10);
/// Records that may wait in the tap for the planner.
pub const TAP_CAPACITY: usize = 1 << 16;

enum Msg {
    Record(Record),
    Finish {
        stats: Option<Stats>,
        end_t_ns: u64,
        done: Sender<()>,
    },
}

/// The open trace of this process.
#[derive(Debug)]
pub struct Recorder {
    tx: Sender<Msg>,
    start: Instant,
    path: PathBuf,
    dropped: Arc<AtomicU64>,
    closed: AtomicBool,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Msg::Record(r) => f.debug_tuple("Record").field(r).finish(),
            Msg::Finish { .. } => f.write_str("Finish"),
        }
    }
}

impl Recorder {
    /// Creates (truncates) `path`, writes the header, and starts the writer thread.
    pub fn start(path: &Path, producer: String, command: String) -> io::Result<Recorder> {
        let file = File::create(path)?;
        let start = Instant::now();
        let start_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let header = Header {
            format_version: FORMAT_VERSION,
            pid: std::process::id(),
            start_unix_ns,
            producer,
            command,
        };
        let mut writer = Writer::new(BufWriter::with_capacity(1 << 20, file), &header)?;
        writer.flush()?;
        let (tx, rx) = channel::bounded::<Msg>(QUEUE_CAPACITY);
        let dropped = Arc::new(AtomicU64::new(0));
        let thread_dropped = Arc::clone(&dropped);
        let thread_path = path.to_owned();
        std::thread::Builder::new()
            .name("tensile-trace".into())
            .spawn(move || write_loop(writer, rx, thread_dropped, thread_path))?;
        Ok(Recorder {
            tx,
            start,
            path: path.to_owned(),
            dropped,
            closed: AtomicBool::new(false),
        })
    }

    /// Nanoseconds since the trace started.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Nanoseconds from the trace's start to `at` (0 for an instant before it).
    #[inline]
    pub fn ns_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.start).as_nanos() as u64
    }

    /// Where the trace is written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queues `record`; drops it (and counts it) if the queue stays full for
    /// [`SEND_PATIENCE`] or the trace is closed.
    pub fn record(&self, record: Record) {
        if self.closed.load(Ordering::Relaxed) {
            self.count_drop();
            return;
        }
        let msg = match self.tx.try_send(Msg::Record(record)) {
            Ok(()) => return,
            Err(TrySendError::Full(msg)) => msg,
            Err(TrySendError::Disconnected(_)) => {
                self.count_drop();
                return;
            }
        };
        match self.tx.send_timeout(msg, SEND_PATIENCE) {
            Ok(()) => {}
            Err(SendTimeoutError::Timeout(_) | SendTimeoutError::Disconnected(_)) => {
                self.count_drop()
            }
        }
    }

    fn count_drop(&self) {
        if self.dropped.fetch_add(1, Ordering::Relaxed) == 0 && !self.closed.load(Ordering::Relaxed)
        {
            tracing::warn!(
                "trace queue full: dropping records (the trace writer cannot keep up with {})",
                self.path.display()
            );
        }
    }

    /// Records dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Writes `stats` and the `End` record and waits (up to [`FINISH_PATIENCE`]) until the
    /// file is complete. Later records are dropped. Only the first call does anything.
    pub fn finish(&self, stats: Option<Stats>) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let (done, wait) = channel::bounded(1);
        let end_t_ns = self.now_ns();
        if self
            .tx
            .send_timeout(
                Msg::Finish {
                    stats,
                    end_t_ns,
                    done,
                },
                FINISH_PATIENCE,
            )
            .is_err()
        {
            tracing::warn!(
                "the trace writer did not take the end of the trace; {} may be incomplete",
                self.path.display()
            );
            return;
        }
        if wait.recv_timeout(FINISH_PATIENCE).is_err() {
            tracing::warn!(
                "the trace writer did not finish in time; {} may be incomplete",
                self.path.display()
            );
        }
    }

    /// Stops recording without writing anything more: in a forked child, which has no
    /// writer thread and must not touch the parent's file.
    pub fn abandon(&self) {
        self.closed.store(true, Ordering::Release);
    }
}

fn write_loop(
    mut writer: Writer<BufWriter<File>>,
    rx: channel::Receiver<Msg>,
    dropped: Arc<AtomicU64>,
    path: PathBuf,
) {
    let mut failed = false;
    let mut last_flush = Instant::now();
    let fail = |e: io::Error, failed: &mut bool| {
        if !*failed {
            tracing::error!(
                "cannot write the trace to {}: {e}; recording stops",
                path.display()
            );
        }
        *failed = true;
    };
    let mut poller = Poller::new();
    loop {
        match poller.next(&rx) {
            Polled::Message(Msg::Record(r)) => {
                if !failed {
                    if let Err(e) = writer.write(&r) {
                        fail(e, &mut failed);
                    }
                } else {
                    dropped.fetch_add(1, Ordering::Relaxed);
                }
                if !failed && last_flush.elapsed() >= FLUSH_INTERVAL {
                    if let Err(e) = writer.flush() {
                        fail(e, &mut failed);
                    }
                    last_flush = Instant::now();
                }
            }
            Polled::Message(Msg::Finish {
                stats,
                end_t_ns,
                done,
            }) => {
                if !failed {
                    let result = stats
                        .map_or(Ok(()), |s| writer.write(&Record::Stats(s)))
                        .and_then(|()| {
                            writer.finish(End {
                                t_ns: end_t_ns,
                                dropped_records: dropped.load(Ordering::Relaxed),
                            })
                        });
                    if let Err(e) = result {
                        fail(e, &mut failed);
                    }
                }
                let n = dropped.load(Ordering::Relaxed);
                if n > 0 {
                    tracing::warn!(
                        "{n} trace records were dropped; {} is incomplete",
                        path.display()
                    );
                }
                let _ = done.send(());
                return;
            }
            Polled::Nothing => {
                if !failed && last_flush.elapsed() >= FLUSH_INTERVAL {
                    if let Err(e) = writer.flush() {
                        fail(e, &mut failed);
                    }
                    last_flush = Instant::now();
                }
            }
            Polled::Gone => {
                let _ = writer.flush();
                return;
            }
        }
    }
}

/// Without a trace file, one launch in this many (per thread) is timed for the planner.
pub const TAP_TIMING_EVERY: u32 = 16;

/// Where the hooks' records go: the trace file, the tap, or both.
#[derive(Debug)]
pub struct RecordSink {
    file: Option<Recorder>,
    tap: Option<RecordTap>,
    /// Time 0 of the records when there is no trace file (with one, the file's).
    start: Instant,
}

/// The bounded queue of records for the planner.
#[derive(Debug)]
struct RecordTap {
    tx: Sender<Record>,
    /// Handed out once, to the consumer ([`RecordSink::take_tap`]).
    rx: std::sync::Mutex<Option<channel::Receiver<Record>>>,
    /// Whether the consumer took it: records flow from then on.
    live: AtomicBool,
    dropped: AtomicU64,
}

impl RecordSink {
    /// A sink over the trace file `file` and, if `tap`, a tap of [`TAP_CAPACITY`] records.
    /// `None` when there is nowhere to send records: the hooks then build none.
    pub fn new(file: Option<Recorder>, tap: bool) -> Option<RecordSink> {
        if file.is_none() && !tap {
            return None;
        }
        let tap = tap.then(|| {
            let (tx, rx) = channel::bounded(TAP_CAPACITY);
            RecordTap {
                tx,
                rx: std::sync::Mutex::new(Some(rx)),
                live: AtomicBool::new(false),
                dropped: AtomicU64::new(0),
            }
        });
        Some(RecordSink {
            file,
            tap,
            start: Instant::now(),
        })
    }

    /// Whether anything takes records now: the trace file, or a tap whose consumer took it.
    /// The hooks build no record otherwise.
    #[inline]
    pub fn is_live(&self) -> bool {
        self.file.is_some() || self.live_tap().is_some()
    }

    #[inline]
    fn live_tap(&self) -> Option<&RecordTap> {
        self.tap.as_ref().filter(|t| t.live.load(Ordering::Relaxed))
    }

    /// Sends `record` to the trace file and the tap.
    #[inline]
    pub fn record(&self, record: Record) {
        match (&self.file, self.live_tap()) {
            (Some(file), Some(tap)) => {
                tap.send(record.clone());
                file.record(record);
            }
            (Some(file), None) => file.record(record),
            (None, Some(tap)) => tap.send(record),
            (None, None) => {}
        }
    }

    /// Whether the launch about to be made should be timed on the GPU (`LaunchTime`): every
    /// launch when tracing; one in [`TAP_TIMING_EVERY`] per thread when only the planner
    /// listens (it prices the others by their kernel's median), so that learning costs the
    /// application two event records per that many launches, not per launch.
    #[inline]
    pub fn wants_launch_time(&self) -> bool {
        if self.file.is_some() {
            return true;
        }
        thread_local! {
            static LAUNCHES: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
        }
        LAUNCHES
            .try_with(|n| {
                let k = n.get();
                n.set(k.wrapping_add(1));
                k % TAP_TIMING_EVERY == 0
            })
            .unwrap_or(false)
    }

    /// Nanoseconds since the records' time 0 (the trace's start when tracing).
    #[inline]
    pub fn now_ns(&self) -> u64 {
        match &self.file {
            Some(file) => file.now_ns(),
            None => self.start.elapsed().as_nanos() as u64,
        }
    }

    /// The trace file, when tracing.
    pub fn file(&self) -> Option<&Recorder> {
        self.file.as_ref()
    }

    /// The consuming end of the tap; `None` without a tap or once taken. Records flow into
    /// it from now on (take it before the first launch to see every `Kernel` record: each is
    /// made once, at the kernel's first launch).
    pub fn take_tap(&self) -> Option<channel::Receiver<Record>> {
        let tap = self.tap.as_ref()?;
        let rx = tap.rx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if rx.is_some() {
            tap.live.store(true, Ordering::Relaxed);
        }
        rx
    }

    /// Records the tap dropped because it was full (or its consumer gone).
    pub fn tap_dropped(&self) -> u64 {
        self.tap
            .as_ref()
            .map_or(0, |t| t.dropped.load(Ordering::Relaxed))
    }
}

impl RecordTap {
    #[inline]
    fn send(&self, record: Record) {
        if self.tx.try_send(record).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The memory manager's journal written to the trace: each swap a [`Record::Swap`], each
/// span of host time a [`Record::Busy`] (the trace file only: the planner's tap carries what
/// the application did, not what the library did).
pub struct TraceJournal;

impl TraceJournal {
    fn recorder() -> Option<&'static Recorder> {
        crate::runtime::existing().and_then(|rt| rt.recorder())
    }
}

impl Journal for TraceJournal {
    fn swap(&self, at: Instant, dir: SwapDir, cause: SwapCause, runs: &[(u64, u32)], bytes: u64) {
        if let Some(rec) = Self::recorder() {
            let pages: u64 = runs.iter().map(|&(_, n)| u64::from(n)).sum();
            rec.record(Record::Swap(Swap {
                t_ns: rec.ns_at(at),
                dir,
                cause,
                pages: u32::try_from(pages).unwrap_or(u32::MAX),
                bytes,
                runs: runs.to_vec(),
            }));
        }
    }

    fn busy(&self, start: Instant, end: Instant, kind: BusyKind, pages: usize) {
        if let Some(rec) = Self::recorder() {
            rec.record(Record::Busy(Busy {
                t_ns: rec.ns_at(start),
                dur_ns: end.saturating_duration_since(start).as_nanos() as u64,
                kind,
                thread: thread_id(),
                pages: u32::try_from(pages).unwrap_or(u32::MAX),
            }));
        }
    }
}

/// The calling thread's kernel id (`gettid`), asked once per thread.
fn thread_id() -> u32 {
    thread_local! {
        static TID: u32 = {
            // SAFETY: `gettid` takes no arguments and cannot fail.
            let tid = unsafe { libc::syscall(libc::SYS_gettid) };
            u32::try_from(tid).unwrap_or(0)
        };
    }
    TID.try_with(|t| *t).unwrap_or(0)
}

/// The command line of this process, arguments separated by spaces.
pub fn command_line() -> String {
    match std::fs::read("/proc/self/cmdline") {
        Ok(raw) => raw
            .split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect::<Vec<_>>()
            .join(" "),
        Err(_) => std::env::args().collect::<Vec<_>>().join(" "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensile_trace::{Free, Reader, Sync, SyncScope, TraceError};

    /// What a send costs the launch path when the consumer blocks in the channel (it must be
    /// woken) and when it polls ([`Poller`]), with sends `gap` apart as a training
    /// step's launches are: `cargo test --release -p tensile-shim --lib
    /// recorder::tests::send_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "benchmark; run with --ignored --nocapture in release"]
    fn send_cost_to_a_blocked_and_to_a_polling_consumer() {
        fn ns_per_send(polling: bool, gap: Duration) -> f64 {
            let (tx, rx) = channel::bounded::<Vec<u64>>(TAP_CAPACITY);
            let stop = Arc::new(AtomicBool::new(false));
            let done = stop.clone();
            let consumer = std::thread::spawn(move || {
                let mut poller = Poller::new();
                while !done.load(Ordering::Relaxed) {
                    let first = if polling {
                        match poller.next(&rx) {
                            Polled::Message(m) => Some(m),
                            Polled::Nothing | Polled::Gone => None,
                        }
                    } else {
                        rx.recv_timeout(Duration::from_millis(50)).ok()
                    };
                    if first.is_some() {
                        for _ in rx.try_iter() {}
                    }
                }
            });
            let sends = 50_000u32;
            let mut spent = Duration::ZERO;
            for i in 0..sends {
                let until = Instant::now() + gap;
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
                let t = Instant::now();
                let _ = tx.try_send(vec![u64::from(i); 3]);
                spent += t.elapsed();
            }
            stop.store(true, Ordering::Relaxed);
            consumer.join().expect("consumer");
            spent.as_nanos() as f64 / f64::from(sends)
        }
        for gap_us in [0, 5, 20, 40] {
            let gap = Duration::from_micros(gap_us);
            println!(
                "sends {gap_us:>2} us apart: {:>7.0} ns to a blocked consumer, {:>5.0} ns to a \
                 polling one",
                ns_per_send(false, gap),
                ns_per_send(true, gap)
            );
        }
    }

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("tensile-recorder-{}-{name}", std::process::id()))
    }

    #[test]
    fn writes_header_records_stats_and_end() {
        let path = temp("basic.trace");
        let rec = Recorder::start(&path, "test".into(), "cmd a b".into()).unwrap();
        for id in 0..1000 {
            rec.record(Record::Free(Free {
                t_ns: id,
                stream: 7,
                id,
            }));
        }
        rec.record(Record::Sync(Sync {
            t_ns: 5,
            scope: SyncScope::Context,
        }));
        let stats = Stats {
            bytes_to_host: 0,
            bytes_to_device: 0,
            stalled_launches: 0,
            stall_ns: 0,
            peak_resident_bytes: 42,
            host_pool_bytes: 0,
        };
        rec.finish(Some(stats.clone()));
        rec.record(Record::Free(Free {
            t_ns: 0,
            stream: 0,
            id: 9999,
        }));

        let mut reader = Reader::open(&path).unwrap();
        assert_eq!(reader.header().command, "cmd a b");
        assert_eq!(reader.header().pid, std::process::id());
        let records: Vec<Record> = reader.by_ref().collect::<Result<_, _>>().unwrap();
        assert!(reader.finished_cleanly());
        assert_eq!(records.len(), 1000 + 1 + 2);
        for (i, r) in records[..1000].iter().enumerate() {
            assert_eq!(
                r,
                &Record::Free(Free {
                    t_ns: i as u64,
                    stream: 7,
                    id: i as u64
                })
            );
        }
        assert_eq!(records[1001], Record::Stats(stats));
        let Record::End(end) = &records[1002] else {
            panic!("{:?}", records[1002])
        };
        assert_eq!(end.dropped_records, 0);
        assert_eq!(rec.dropped(), 1, "the record after finish is dropped");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn records_reach_the_file_without_finish() {
        let path = temp("flush.trace");
        let rec = Recorder::start(&path, "test".into(), String::new()).unwrap();
        rec.record(Record::Free(Free {
            t_ns: 1,
            stream: 0,
            id: 1,
        }));
        std::thread::sleep(FLUSH_INTERVAL * 4);
        // The process "crashes" here: no End record, but the record is on disk.
        let mut reader = Reader::open(&path).unwrap();
        assert_eq!(
            reader.next().unwrap().unwrap(),
            Record::Free(Free {
                t_ns: 1,
                stream: 0,
                id: 1
            })
        );
        assert!(matches!(
            reader.next(),
            Some(Err(TraceError::Truncated { .. })) | None
        ));
        assert!(!reader.finished_cleanly());
        rec.abandon();
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn the_tap_gets_every_record_until_full_then_counts_drops() {
        assert!(RecordSink::new(None, false).is_none());
        let sink = RecordSink::new(None, true).unwrap();
        let free = |id| {
            Record::Free(Free {
                t_ns: 0,
                stream: 0,
                id,
            })
        };
        // Nobody took the tap yet: no record is wanted.
        assert!(!sink.is_live());
        sink.record(free(u64::MAX));
        let rx = sink.take_tap().unwrap();
        assert!(sink.is_live());
        assert!(sink.take_tap().is_none(), "the tap is handed out once");
        for id in 0..(TAP_CAPACITY as u64 + 10) {
            sink.record(free(id));
        }
        assert_eq!(sink.tap_dropped(), 10);
        let got: Vec<Record> = rx.try_iter().collect();
        assert_eq!(got.len(), TAP_CAPACITY);
        assert_eq!(got[0], free(0));
        assert_eq!(got[TAP_CAPACITY - 1], free(TAP_CAPACITY as u64 - 1));
    }

    #[test]
    fn with_a_file_and_a_tap_both_get_the_record() {
        let path = temp("both.trace");
        let rec = Recorder::start(&path, "test".into(), String::new()).unwrap();
        let sink = RecordSink::new(Some(rec), true).unwrap();
        assert!(sink.is_live(), "the file takes records");
        let rx = sink.take_tap().unwrap();
        let record = Record::Free(Free {
            t_ns: 3,
            stream: 1,
            id: 42,
        });
        sink.record(record.clone());
        sink.file().unwrap().finish(None);
        assert_eq!(rx.try_recv().unwrap(), record);
        let mut reader = Reader::open(&path).unwrap();
        assert_eq!(reader.next().unwrap().unwrap(), record);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn an_unwritable_path_fails_at_start() {
        let err = Recorder::start(
            Path::new("/nonexistent-dir/x.trace"),
            "t".into(),
            String::new(),
        );
        assert!(err.is_err());
    }
}
