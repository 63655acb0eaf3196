//! Events: markers recorded into streams, completed by the stream's worker when it reaches
//! them. An event remembers only its latest record, as in CUDA: a wait or query refers to
//! the record current at the time of the call.

use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Debug, Default)]
struct EventState {
    /// Records issued (the generation of the latest one).
    recorded: u64,
    /// Latest generation the stream has reached.
    completed: u64,
    /// When the work before the latest completed record ended on the card's clock
    /// (`card::now_ns`): its timestamp for `cuEventElapsedTime`, and when work that waits on
    /// it may start.
    virtual_ns: u64,
    /// The capture sequence the latest record was captured into (instead of issued).
    captured_in: Option<u64>,
}

#[derive(Debug)]
pub struct Event {
    pub flags: u32,
    state: Mutex<EventState>,
    cv: Condvar,
}

impl Event {
    pub fn new(flags: u32) -> Self {
        Self {
            flags,
            state: Mutex::new(EventState::default()),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, EventState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a new record; returns its generation (to complete in stream order).
    pub fn begin_record(&self) -> u64 {
        let mut s = self.lock();
        s.recorded += 1;
        s.captured_in = None;
        s.recorded
    }

    /// The latest record was captured into capture `id` rather than issued.
    pub fn mark_captured(&self, id: u64) {
        self.lock().captured_in = Some(id);
    }

    /// The capture the latest record went into, if it was captured.
    pub fn captured_in(&self) -> Option<u64> {
        self.lock().captured_in
    }

    /// The stream reached record `generation`.
    pub fn complete(&self, generation: u64) {
        self.complete_at(generation, crate::card::now_ns());
    }

    /// Completes `generation`, recorded when the work before it ended at `virtual_ns`.
    pub fn complete_at(&self, generation: u64, virtual_ns: u64) {
        let mut s = self.lock();
        if generation > s.completed {
            s.completed = generation;
            s.virtual_ns = virtual_ns;
        }
        self.cv.notify_all();
    }

    /// When the work before the latest completed record ended, on the card's clock.
    pub fn virtual_time(&self) -> u64 {
        self.lock().virtual_ns
    }

    /// The generation a wait issued now must wait for (0: never recorded, nothing to wait).
    pub fn current_generation(&self) -> u64 {
        self.lock().recorded
    }

    /// Whether the latest record has completed (true if never recorded, as in CUDA).
    pub fn is_done(&self) -> bool {
        let s = self.lock();
        s.completed >= s.recorded
    }

    /// Blocks until record `generation` has completed.
    pub fn wait_generation(&self, generation: u64) {
        let mut s = self.lock();
        while s.completed < generation {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Blocks until the latest record (as of now) has completed.
    pub fn wait(&self) {
        let g = self.current_generation();
        self.wait_generation(g);
    }

    /// (ever recorded, completion time of the latest record if it has completed).
    pub fn timestamp(&self) -> (bool, Option<u64>) {
        let s = self.lock();
        (
            s.recorded > 0,
            if s.completed >= s.recorded {
                Some(s.virtual_ns)
            } else {
                None
            },
        )
    }
}
