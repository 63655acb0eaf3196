//! Workload: a size sweep of the arena allocator, as PyTorch's `cudaMallocAsync` backend
//! would drive it (one driver allocation per tensor, thousands live, every size, two
//! streams).
//!
//! `wl_sizes [seed] [live] [rounds]` (defaults 7, 2400, 12). It allocates `live` buffers:
//! first a run of 128 of exactly 1 MiB (a quarter of `live` at most), then sizes drawn
//! (seeded) from every class: a few bytes, sub-page, exactly 1 MiB and 1 MiB +/- a little,
//! exactly 2 MiB, a page +/- 1 byte and +/- 64 KiB, 1,769,472 bytes (a GPT-2 size the old
//! allocator refused) and several pages, with `cuMemAllocAsync` on one of two non-blocking
//! streams at random. Each buffer is filled with its own byte (`cuMemsetD8Async`) and stamped
//! with its serial number and stamp index every 2 MiB from its start and at its last bytes
//! (`cuMemcpyHtoDAsync`), so every 2 MiB page it touches holds a stamp.
//!
//! Then, `rounds` times, a seeded random eighth of the buffers, in random order, has every
//! stamp read back (`cuMemcpyDtoHAsync`, queued), is freed at once on a random stream
//! (`cuMemFreeAsync`, after an event wait when that is not its own stream) and replaced by a
//! new buffer of a random size on a random stream; after a synchronization the reads are
//! compared. Memory handed to another stream before the free executed would be overwritten
//! before its reads ran (under libtensile two rules prevent that: the allocator's, and the
//! manager's ordering of each page's reuse after the fences of its last uses). At the end
//! every buffer is checked and freed.
//!
//! A wrong byte panics with the buffer, offset and both values. Output: `S <seed> <live>
//! <rounds>`, `A <allocations> <bytes allocated>`, `C <stamps checked> <digest>` (a digest
//! of every value read back, equal across runs of one seed), then `done`.
//! Nothing here knows about libtensile; it reaches the driver as libcudart does.

use std::ffi::c_void;

use tensile_driver_abi::{CUdeviceptr, CUevent, CUstream, CU_EVENT_DISABLE_TIMING};
use tensile_tests::driver::{check, Lookup};
use tensile_tests::expect::fnv1a;
use tensile_tests::rng::Rng;
use tensile_tests::session::Session;

const PAGE: usize = 2 << 20;
const MIB: usize = 1 << 20;
const KIB: usize = 1 << 10;
/// Exactly-1-MiB buffers allocated one after the other at the start.
const RUN_OF_1MIB: usize = 128;
/// Bytes of one stamp: serial (u32), page index (u32).
const STAMP: usize = 8;

/// A size from every class; most are small, as in a training step, so thousands stay live
/// in a footprint of a few hundred MiB.
fn size(r: &mut Rng) -> usize {
    match r.below(1000) {
        500..=879 => 4 * KIB + r.below(60 * KIB),
        880..=909 => 64 * KIB + r.below(PAGE / 2 - 64 * KIB),
        // Enough exactly-1-MiB ones live (about 80) to trip the old allocator.
        910..=949 => MIB,
        950 => MIB - 1,
        951 => MIB + 1,
        952 => MIB + 256,
        953..=956 => 2 * MIB,
        957 | 958 => PAGE - 1,
        959 | 960 => PAGE + 1,
        961 | 962 => PAGE - 64 * KIB,
        963 | 964 => PAGE + 64 * KIB,
        965..=972 => 1_769_472,
        973 | 974 => 2 * PAGE + r.below(3 * PAGE),
        _ => 1 + r.below(4 * KIB),
    }
}

#[derive(Debug, Clone, Copy)]
struct Buffer {
    ptr: CUdeviceptr,
    bytes: usize,
    serial: u32,
    stream: usize,
}

impl Buffer {
    /// The fill byte (never 0, so unwritten memory shows).
    fn fill(&self) -> u8 {
        (self.serial % 251) as u8 + 1
    }

    /// Offsets of its stamps: every 2 MiB from its start, and its last bytes; each
    /// `(offset, length)`. Every page the buffer touches holds the start of one, wherever
    /// the allocator put it, and the offsets do not depend on the address (so runs under
    /// different allocators read the same bytes).
    fn stamp_places(&self) -> Vec<(usize, usize)> {
        let mut places: Vec<(usize, usize)> = (0..self.bytes)
            .step_by(PAGE)
            .map(|off| (off, STAMP.min(self.bytes - off)))
            .collect();
        let tail = self.bytes.saturating_sub(STAMP);
        if places.last().is_some_and(|&(off, _)| off + STAMP <= tail) {
            places.push((tail, STAMP));
        }
        places
    }

    /// What a stamp at `index` (of [`Self::stamp_places`]) holds.
    fn stamp(&self, index: usize) -> [u8; STAMP] {
        let mut s = [0u8; STAMP];
        s[..4].copy_from_slice(&self.serial.to_le_bytes());
        s[4..].copy_from_slice(&(index as u32 ^ 0x5a5a_0000).to_le_bytes());
        s
    }
}

struct Sweep {
    s: Session,
    streams: [CUstream; 2],
    /// Orders a free on one stream after the work queued on another.
    event: CUevent,
    rng: Rng,
    serial: u32,
    allocations: usize,
    bytes_allocated: usize,
    checked: usize,
    digest: Vec<u8>,
    /// Host sources of queued stamp copies (each its own heap buffer, so it stays put),
    /// kept until the streams are synchronized.
    in_flight: Vec<Vec<u8>>,
}

impl Sweep {
    fn alloc(&mut self) -> Buffer {
        let bytes = size(&mut self.rng);
        self.alloc_bytes(bytes)
    }

    fn alloc_bytes(&mut self, bytes: usize) -> Buffer {
        let stream = self.rng.below(2);
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; a live stream.
        check(
            unsafe { (self.s.d.cuMemAllocAsync)(&mut ptr, bytes, self.streams[stream]) },
            "cuMemAllocAsync",
        );
        assert!(
            ptr != 0 && ptr.is_multiple_of(256),
            "{bytes} bytes at {ptr:#x}"
        );
        self.serial += 1;
        self.allocations += 1;
        self.bytes_allocated += bytes;
        let b = Buffer {
            ptr,
            bytes,
            serial: self.serial,
            stream,
        };
        let st = self.streams[stream];
        // SAFETY: `b` is a live allocation of `bytes` bytes; the stamp sources are boxed and
        // kept in `in_flight` until the stream is synchronized.
        unsafe {
            check(
                (self.s.d.cuMemsetD8Async)(ptr, b.fill(), bytes, st),
                "cuMemsetD8Async",
            );
            for (i, (off, len)) in b.stamp_places().into_iter().enumerate() {
                let src = b.stamp(i).to_vec();
                check(
                    (self.s.d.cuMemcpyHtoDAsync)(
                        ptr + off as u64,
                        src.as_ptr().cast::<c_void>(),
                        len,
                        st,
                    ),
                    "cuMemcpyHtoDAsync",
                );
                self.in_flight.push(src);
            }
        }
        b
    }

    fn sync(&mut self) {
        for st in self.streams {
            // SAFETY: a live stream.
            check(
                unsafe { (self.s.d.cuStreamSynchronize)(st) },
                "cuStreamSynchronize",
            );
        }
        self.in_flight.clear();
    }

    /// Reads back every stamp of `bufs` (and a fill byte before the tail stamp) and
    /// compares. The streams must be synchronized with the writes.
    /// Reads back every stamp of `bufs` and compares, after synchronizing.
    fn verify(&mut self, bufs: &[Buffer]) {
        let reads = self.queue_reads(bufs);
        self.sync();
        self.compare(bufs, reads);
    }

    /// Queues the reads of every stamp of `bufs` (and a fill byte after the first stamp) on
    /// each buffer's stream; [`Self::compare`] checks them once the streams are synchronized.
    fn queue_reads(&mut self, bufs: &[Buffer]) -> Vec<Read> {
        let mut reads: Vec<Read> = Vec::new();
        for (bi, b) in bufs.iter().enumerate() {
            let st = self.streams[b.stream];
            let places = b.stamp_places();
            for (i, &(off, len)) in places.iter().enumerate() {
                let want = b.stamp(i)[..len].to_vec();
                let mut got = vec![0u8; len];
                // SAFETY: a live allocation; `got` (its own heap buffer, moved into `reads`)
                // lives until the caller has synchronized the stream.
                check(
                    unsafe {
                        (self.s.d.cuMemcpyDtoHAsync)(
                            got.as_mut_ptr().cast(),
                            b.ptr + off as u64,
                            len,
                            st,
                        )
                    },
                    "cuMemcpyDtoHAsync",
                );
                reads.push((bi, off, want, got));
            }
            // One fill byte right after the first stamp, if the buffer has one there.
            if b.bytes > STAMP && places.iter().all(|&(off, _)| off != STAMP) {
                let mut got = vec![0u8; 1];
                // SAFETY: as above.
                check(
                    unsafe {
                        (self.s.d.cuMemcpyDtoHAsync)(
                            got.as_mut_ptr().cast(),
                            b.ptr + STAMP as u64,
                            1,
                            st,
                        )
                    },
                    "cuMemcpyDtoHAsync",
                );
                reads.push((bi, STAMP, vec![b.fill()], got));
            }
        }
        reads
    }

    fn compare(&mut self, bufs: &[Buffer], reads: Vec<Read>) {
        for (bi, off, want, got) in reads {
            let b = &bufs[bi];
            assert_eq!(
                got, want,
                "buffer {} ({} bytes at {:#x}, stream {}): offset {off} holds {got:?}, \
                 expected {want:?}",
                b.serial, b.bytes, b.ptr, b.stream
            );
            self.checked += 1;
            self.digest.extend_from_slice(&got);
        }
    }

    /// Frees `b` on a random stream. On the other stream than its own, that stream first
    /// waits for an event recorded on its own (as PyTorch's `record_stream` makes a free wait
    /// for the streams that used a tensor), so the free is ordered after the work queued on
    /// `b`; the allocator must then not hand it to another stream before the free executed.
    fn free(&mut self, b: Buffer) {
        let stream = self.rng.below(2);
        // SAFETY: a live allocation; live streams and event.
        unsafe {
            if stream != b.stream {
                check(
                    (self.s.d.cuEventRecord)(self.event, self.streams[b.stream]),
                    "cuEventRecord",
                );
                check(
                    (self.s.d.cuStreamWaitEvent)(self.streams[stream], self.event, 0),
                    "cuStreamWaitEvent",
                );
            }
            check(
                (self.s.d.cuMemFreeAsync)(b.ptr, self.streams[stream]),
                "cuMemFreeAsync",
            );
        }
    }
}

/// A queued read: buffer index, offset, expected bytes, the host buffer read into.
type Read = (usize, usize, Vec<u8>, Vec<u8>);

fn main() {
    let mut args = std::env::args().skip(1);
    let mut num = |default: u64| -> u64 {
        args.next().map_or(default, |a| {
            a.parse().expect("usage: wl_sizes [seed] [live] [rounds]")
        })
    };
    let (seed, live, rounds) = (num(7), num(2400) as usize, num(12) as usize);
    let s = Session::start(Lookup::ProcAddress {
        version: 13000,
        flags: 0,
    });
    let streams = [s.stream(), s.stream()];
    let mut event: CUevent = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    check(
        unsafe { (s.d.cuEventCreate)(&mut event, CU_EVENT_DISABLE_TIMING) },
        "cuEventCreate",
    );
    let mut w = Sweep {
        s,
        streams,
        event,
        rng: Rng(seed),
        serial: 0,
        allocations: 0,
        bytes_allocated: 0,
        checked: 0,
        digest: Vec::new(),
        in_flight: Vec::new(),
    };
    w.s.say(format_args!("S {seed} {live} {rounds}"));
    // First a run of equal exactly-1-MiB tensors (a layer's worth, as PyTorch makes them):
    // the old allocator refused every request after about 65 of these.
    let mut bufs: Vec<Buffer> = (0..live)
        .map(|i| {
            if i < RUN_OF_1MIB.min(live / 4) {
                w.alloc_bytes(MIB)
            } else {
                w.alloc()
            }
        })
        .collect();
    w.sync();
    for _ in 0..rounds {
        // A random eighth, in random order: checked, freed, replaced.
        let mut victims: Vec<usize> = Vec::new();
        while victims.len() < (live / 8).max(1) {
            let i = w.rng.below(live);
            if !victims.contains(&i) {
                victims.push(i);
            }
        }
        // Their reads are queued, then they are freed and replaced at once: the reads
        // execute later (streams are asynchronous), while the new buffers are written.
        let checked: Vec<Buffer> = victims.iter().map(|&i| bufs[i]).collect();
        let reads = w.queue_reads(&checked);
        for &i in &victims {
            w.free(bufs[i]);
            bufs[i] = w.alloc();
        }
        w.sync();
        w.compare(&checked, reads);
        w.sync();
    }
    w.verify(&bufs);
    for b in bufs {
        w.free(b);
    }
    w.sync();
    w.s.say(format_args!("A {} {}", w.allocations, w.bytes_allocated));
    w.s.say(format_args!("C {} {:016x}", w.checked, fnv1a(&w.digest)));
    w.s.say("done");
}
