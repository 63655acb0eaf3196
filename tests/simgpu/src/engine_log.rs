//! The card's work, item by item (`TENSILE_SIM_ENGINE_LOG=PATH`, `%p` in PATH replaced by the
//! pid): one line per kernel and host copy a stream ran, as
//! `KIND STREAM QUEUED READY END BYTES`, times in ns on the card's clock (`card::now_ns`).
//! `KIND` is `K` (a kernel), `H` (host to device), `D` (device to host) or `C` (a copy the
//! card made without the bus); `QUEUED` is when the host queued the item, `READY` when its
//! stream and what it waited for let it go, `END` when it ended. So an idle compute engine
//! can be told apart: a kernel queued after the one before it ended waited for the host; one
//! queued earlier but ready later waited for a copy or an event. `tensile rerun` sets it for
//! its managed runs and prints that split (docs/rerun.md, "Session 31").
//!
//! Unset: one relaxed load per item. Each line is one `write` to a file opened for append, so
//! lines from several streams do not interleave.

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

const VAR: &str = "TENSILE_SIM_ENGINE_LOG";

/// 0: not read yet; 1: off; 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);
static FILE: Mutex<Option<File>> = Mutex::new(None);

/// What an item was, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Kernel,
    ToDevice,
    ToHost,
    OnCard,
}

impl Kind {
    fn letter(self) -> char {
        match self {
            Kind::Kernel => 'K',
            Kind::ToDevice => 'H',
            Kind::ToHost => 'D',
            Kind::OnCard => 'C',
        }
    }
}

/// Whether items are logged (reads the variable once).
#[inline]
pub fn on() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => open(),
    }
}

#[cold]
fn open() -> bool {
    let file = std::env::var_os(VAR)
        .filter(|v| !v.is_empty())
        .and_then(|path| {
            let path = path
                .to_string_lossy()
                .replace("%p", &std::process::id().to_string());
            match std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
            {
                Ok(f) => Some(f),
                Err(e) => {
                    eprintln!("tensile-simgpu: cannot open the engine log {path}: {e}");
                    None
                }
            }
        });
    let mut slot = FILE.lock().unwrap_or_else(|e| e.into_inner());
    if STATE.load(Ordering::Acquire) == 0 {
        let on = file.is_some();
        *slot = file;
        STATE.store(if on { 2 } else { 1 }, Ordering::Release);
    }
    STATE.load(Ordering::Acquire) == 2
}

/// Logs one item of stream `stream` (when logging is on).
pub fn item(kind: Kind, stream: u64, queued: u64, ready: u64, end: u64, bytes: u64) {
    if !on() {
        return;
    }
    let line = format!(
        "{} {stream} {queued} {ready} {end} {bytes}\n",
        kind.letter()
    );
    if let Some(f) = FILE.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        let _ = f.write_all(line.as_bytes());
    }
}
