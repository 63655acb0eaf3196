//! A job's event ring: single producer (the job), single consumer (the coordinator), frames
//! of bytes in a power-of-two ring of 64-bit words.
//!
//! `head` and `tail` count bytes ever written and read (they never wrap; positions are taken
//! modulo the capacity). A frame is one header word, `payload_len | lost_before << 32`, then
//! the payload padded to whole words, so every frame starts on a word. `lost_before` counts
//! the records the producer dropped since its previous frame: the consumer learns exactly
//! where the stream has a gap.
//!
//! Rules:
//! - The producer writes the words, then publishes `head` with `Release`; it never waits: a
//!   frame that does not fit is dropped and counted. It keeps its own `head` and reads `tail`;
//!   a `tail` that cannot be right (ahead of `head`, more than a ring behind, not on a word)
//!   makes it start over at `tail`, dropping nothing it had published but the frame at hand.
//! - The consumer loads `head` with `Acquire`, copies a frame out, then publishes `tail` with
//!   `Release`, so the producer never overwrites what is being read. It checks every `head`,
//!   `tail` and length it reads; anything impossible resets the ring (`tail = head`), is
//!   counted, and is reported, never trusted.
//!
//! A frame's payload is records, each postcard-encoded, back to back (encoded by
//! [`crate::JobClient::push`], decoded by [`decode_records`]).

use std::sync::atomic::{AtomicU64, Ordering};

use tensile_trace::Record;

/// Bytes of a frame's header word.
pub const FRAME_HEADER_BYTES: u64 = 8;

/// The ring of one slot: its two counters and its words.
#[derive(Clone, Copy)]
pub(crate) struct Ring<'a> {
    pub head: &'a AtomicU64,
    pub tail: &'a AtomicU64,
    pub words: &'a [AtomicU64],
}

impl Ring<'_> {
    fn capacity(&self) -> u64 {
        self.words.len() as u64 * 8
    }

    fn word_at(&self, byte_position: u64) -> &AtomicU64 {
        // The capacity is a power of two (checked geometry), so the mask keeps it in range.
        &self.words[((byte_position / 8) as usize) & (self.words.len() - 1)]
    }

    /// The largest payload one frame may carry: half the ring, so that one frame never
    /// starves the next.
    pub fn max_payload(&self) -> u64 {
        self.capacity() / 2 - FRAME_HEADER_BYTES
    }
}

/// Why a frame was not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushError {
    /// Not enough free space now.
    Full,
    /// Larger than any frame may be.
    TooLarge,
}

/// The producer's side: its own copy of `head`.
#[derive(Debug)]
pub(crate) struct Producer {
    head: u64,
}

impl Producer {
    pub fn new(head: u64) -> Producer {
        Producer { head }
    }

    /// Writes one frame, or drops it.
    pub fn push(
        &mut self,
        ring: Ring<'_>,
        payload: &[u8],
        lost_before: u64,
    ) -> Result<(), PushError> {
        let len = payload.len() as u64;
        if len > ring.max_payload() {
            return Err(PushError::TooLarge);
        }
        let frame = FRAME_HEADER_BYTES + len.next_multiple_of(8);
        let tail = ring.tail.load(Ordering::Acquire);
        let used = self.head.wrapping_sub(tail);
        if used > ring.capacity() || !tail.is_multiple_of(8) {
            // The consumer reset the ring (or it was garbled): start again where it stands,
            // and say so at once, so the two agree before the next frame.
            self.head = tail.next_multiple_of(8);
            ring.head.store(self.head, Ordering::Release);
        }
        let used = self.head.wrapping_sub(tail);
        if used > ring.capacity() || ring.capacity() - used < frame {
            return Err(PushError::Full);
        }
        let lost = u64::from(u32::try_from(lost_before).unwrap_or(u32::MAX));
        ring.word_at(self.head)
            .store(len | lost << 32, Ordering::Relaxed);
        let mut at = self.head + FRAME_HEADER_BYTES;
        for chunk in payload.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            ring.word_at(at)
                .store(u64::from_le_bytes(w), Ordering::Relaxed);
            at += 8;
        }
        self.head += frame;
        ring.head.store(self.head, Ordering::Release);
        Ok(())
    }
}

/// What the consumer found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadOutcome {
    /// Nothing to read.
    Empty,
    /// A frame, its payload in the caller's buffer.
    Frame {
        /// Records the producer dropped just before this frame.
        lost_before: u64,
    },
    /// The ring held something impossible; it was reset (everything unread is gone).
    Reset(Corruption),
}

/// What was wrong with a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corruption {
    /// `head - tail` is negative or more than the capacity.
    Positions { head: u64, tail: u64 },
    /// A position not on a word.
    Misaligned { head: u64, tail: u64 },
    /// A frame length that is 0, too large, or past `head`.
    FrameLength { length: u64, available: u64 },
    /// A payload that does not decode as records.
    Payload,
}

impl std::fmt::Display for Corruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Corruption::Positions { head, tail } => {
                write!(f, "ring positions head {head}, tail {tail} are impossible")
            }
            Corruption::Misaligned { head, tail } => {
                write!(
                    f,
                    "ring positions head {head}, tail {tail} are not on a word"
                )
            }
            Corruption::FrameLength { length, available } => write!(
                f,
                "a frame of {length} bytes where {available} bytes are in the ring"
            ),
            Corruption::Payload => write!(f, "a frame whose records do not decode"),
        }
    }
}

/// The consumer's own state: the `head` it last reset the ring at. Until the producer moves
/// `head` from there, nothing is new (a garbled head is reported once, not at every read).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Consumer {
    reset_at: Option<u64>,
}

/// Reads the next frame into `payload` (cleared first).
pub(crate) fn read_frame(
    ring: Ring<'_>,
    consumer: &mut Consumer,
    payload: &mut Vec<u8>,
) -> ReadOutcome {
    payload.clear();
    let head = ring.head.load(Ordering::Acquire);
    let tail = ring.tail.load(Ordering::Relaxed);
    if consumer.reset_at == Some(head) {
        return ReadOutcome::Empty;
    }
    consumer.reset_at = None;
    let mut reset = |c: Corruption| {
        // On a word, so the producer (which restarts at the tail) writes aligned frames.
        ring.tail.store(head.next_multiple_of(8), Ordering::Release);
        consumer.reset_at = Some(head);
        ReadOutcome::Reset(c)
    };
    let available = head.wrapping_sub(tail);
    if available > ring.capacity() {
        return reset(Corruption::Positions { head, tail });
    }
    if !head.is_multiple_of(8) || !tail.is_multiple_of(8) {
        return reset(Corruption::Misaligned { head, tail });
    }
    if available == 0 {
        return ReadOutcome::Empty;
    }
    let header = ring.word_at(tail).load(Ordering::Relaxed);
    let length = header & 0xffff_ffff;
    let lost_before = header >> 32;
    if length == 0
        || length > ring.max_payload()
        || FRAME_HEADER_BYTES + length.next_multiple_of(8) > available
    {
        return reset(Corruption::FrameLength { length, available });
    }
    payload.reserve(length as usize);
    let mut at = tail + FRAME_HEADER_BYTES;
    let mut left = length as usize;
    while left > 0 {
        let w = ring.word_at(at).load(Ordering::Relaxed).to_le_bytes();
        let n = left.min(8);
        payload.extend_from_slice(&w[..n]);
        left -= n;
        at += 8;
    }
    ring.tail.store(
        tail + FRAME_HEADER_BYTES + length.next_multiple_of(8),
        Ordering::Release,
    );
    ReadOutcome::Frame { lost_before }
}

/// Resets the ring after its payload turned out to be garbage.
pub(crate) fn reset(ring: Ring<'_>, consumer: &mut Consumer) {
    let head = ring.head.load(Ordering::Acquire);
    ring.tail.store(head.next_multiple_of(8), Ordering::Release);
    consumer.reset_at = Some(head);
}

/// A frame payload that does not decode as records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UndecodablePayload;

/// The records of a frame payload, or `Err` at the first that does not decode (the ones
/// before it are delivered).
pub fn decode_records(
    mut payload: &[u8],
    mut deliver: impl FnMut(Record),
) -> Result<(), UndecodablePayload> {
    while !payload.is_empty() {
        let (record, rest) =
            postcard::take_from_bytes::<Record>(payload).map_err(|_| UndecodablePayload)?;
        deliver(record);
        payload = rest;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Owned {
        head: AtomicU64,
        tail: AtomicU64,
        words: Vec<AtomicU64>,
    }

    impl Owned {
        fn new(bytes: usize) -> Owned {
            Owned {
                head: AtomicU64::new(0),
                tail: AtomicU64::new(0),
                words: (0..bytes / 8).map(|_| AtomicU64::new(0)).collect(),
            }
        }
        fn ring(&self) -> Ring<'_> {
            Ring {
                head: &self.head,
                tail: &self.tail,
                words: &self.words,
            }
        }
    }

    fn frame(n: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| n.wrapping_add(i as u8)).collect()
    }

    #[test]
    fn frames_come_out_in_order_across_the_wrap() {
        let r = Owned::new(256);
        let mut p = Producer::new(0);
        let mut out = Vec::new();
        let mut c = Consumer::default();
        // 40 frames of varied odd lengths through a 256-byte ring: it wraps many times.
        for n in 0..40u8 {
            let payload = frame(n, 1 + (n as usize * 7) % 60);
            p.push(r.ring(), &payload, 0).unwrap();
            assert_eq!(
                read_frame(r.ring(), &mut c, &mut out),
                ReadOutcome::Frame { lost_before: 0 }
            );
            assert_eq!(out, payload);
        }
        assert_eq!(read_frame(r.ring(), &mut c, &mut out), ReadOutcome::Empty);
    }

    #[test]
    fn a_full_ring_drops_and_the_next_frame_says_how_many() {
        let r = Owned::new(256);
        let mut p = Producer::new(0);
        let mut out = Vec::new();
        let mut c = Consumer::default();
        let big = frame(1, 100); // 112 bytes with its header
        p.push(r.ring(), &big, 0).unwrap();
        p.push(r.ring(), &big, 0).unwrap();
        assert_eq!(p.push(r.ring(), &big, 0), Err(PushError::Full));
        assert_eq!(
            p.push(r.ring(), &frame(0, 121), 0),
            Err(PushError::TooLarge)
        );
        assert_eq!(
            read_frame(r.ring(), &mut c, &mut out),
            ReadOutcome::Frame { lost_before: 0 }
        );
        p.push(r.ring(), &frame(9, 10), 3).unwrap();
        assert_eq!(
            read_frame(r.ring(), &mut c, &mut out),
            ReadOutcome::Frame { lost_before: 0 }
        );
        assert_eq!(
            read_frame(r.ring(), &mut c, &mut out),
            ReadOutcome::Frame { lost_before: 3 }
        );
        assert_eq!(out, frame(9, 10));
    }

    #[test]
    fn impossible_positions_and_lengths_reset_the_ring_and_it_recovers() {
        let r = Owned::new(256);
        let mut p = Producer::new(0);
        let mut out = Vec::new();
        let mut c = Consumer::default();
        p.push(r.ring(), &frame(1, 20), 0).unwrap();
        // A head more than a ring ahead.
        r.head.store(10_000, Ordering::Relaxed);
        assert!(matches!(
            read_frame(r.ring(), &mut c, &mut out),
            ReadOutcome::Reset(Corruption::Positions { .. })
        ));
        assert_eq!(r.tail.load(Ordering::Relaxed), 10_000);
        // The producer finds the tail ahead of its head, starts over there, and frames flow.
        p.push(r.ring(), &frame(2, 20), 0).unwrap();
        assert_eq!(
            read_frame(r.ring(), &mut c, &mut out),
            ReadOutcome::Frame { lost_before: 0 }
        );
        assert_eq!(out, frame(2, 20));
        // A garbage length word.
        p.push(r.ring(), &frame(3, 20), 0).unwrap();
        let at = r.tail.load(Ordering::Relaxed);
        r.words[((at / 8) as usize) % r.words.len()].store(u64::MAX, Ordering::Relaxed);
        assert!(matches!(
            read_frame(r.ring(), &mut c, &mut out),
            ReadOutcome::Reset(Corruption::FrameLength { .. })
        ));
        // A misaligned tail.
        p.push(r.ring(), &frame(4, 20), 0).unwrap();
        r.tail.fetch_add(3, Ordering::Relaxed);
        assert!(matches!(
            read_frame(r.ring(), &mut c, &mut out),
            ReadOutcome::Reset(Corruption::Misaligned { .. })
        ));
        p.push(r.ring(), &frame(5, 20), 0).unwrap();
        assert_eq!(
            read_frame(r.ring(), &mut c, &mut out),
            ReadOutcome::Frame { lost_before: 0 }
        );
        assert_eq!(out, frame(5, 20));
        // A garbled head off a word: reported once (not at every read), and the producer's
        // next frame, written where the consumer now stands, arrives.
        r.head.store(0xdead_beef, Ordering::Relaxed);
        assert!(matches!(
            read_frame(r.ring(), &mut c, &mut out),
            ReadOutcome::Reset(Corruption::Positions { .. })
        ));
        assert_eq!(read_frame(r.ring(), &mut c, &mut out), ReadOutcome::Empty);
        p.push(r.ring(), &frame(6, 20), 0).unwrap();
        assert_eq!(
            read_frame(r.ring(), &mut c, &mut out),
            ReadOutcome::Frame { lost_before: 0 }
        );
        assert_eq!(out, frame(6, 20));
        assert_eq!(read_frame(r.ring(), &mut c, &mut out), ReadOutcome::Empty);
    }
}
