//! What a job pays per record on its push path (encode into the batch, write frames). The
//! coordinator drains between chunks of records, outside the timed part, so the ring never
//! fills and only the producer's work is measured. A benchmark, not a test: run with
//! `cargo test -p tensile-protocol --release --test push_bench -- --ignored --nocapture`.

use std::time::Instant;

use tensile_protocol::{CoordinatorSegment, Delivery, Geometry, JobClient, JobOptions};
use tensile_trace::{Access, Launch, Record};

fn launch(seq: u64, accesses: usize) -> Record {
    Record::Launch(Launch {
        t_ns: 1_700_000_000_000 + seq * 3_000,
        stream: 0x5555_0000_1000,
        seq,
        kernel: (seq % 400) as u32,
        grid: [1024, 1, 1],
        block: [256, 1, 1],
        smem: 0,
        accesses: (0..accesses)
            .map(|i| Access {
                alloc: 10_000 + seq % 3000 + i as u64,
                param_offset: 8 * i as u32,
            })
            .collect(),
    })
}

#[test]
#[ignore = "benchmark: prints a table"]
fn push_path_cost_per_record() {
    const CHUNK: usize = 5_000;
    const CHUNKS: usize = 40;
    let name = format!("bench-push-{}", std::process::id());
    let mut coordinator = CoordinatorSegment::create(&name, Geometry::default()).unwrap();
    println!(
        "accesses  bytes/record  records  ns/record (best of 3)  of which encoding  dropped  delivered"
    );
    for accesses in [0usize, 4, 16] {
        let records: Vec<Record> = (0..(CHUNK * CHUNKS) as u64)
            .map(|s| launch(s, accesses))
            .collect();
        let bytes = postcard::to_allocvec(&records[0]).unwrap().len();
        // The encoding alone, into a buffer as the batch is.
        let mut buf = vec![0u8; 4096];
        let t = Instant::now();
        let mut sink = 0usize;
        for r in &records {
            sink += postcard::to_slice(r, &mut buf).unwrap().len();
        }
        let encode_ns = t.elapsed().as_nanos() as f64 / records.len() as f64;
        assert!(sink > 0);
        let mut best = f64::MAX;
        let (mut dropped, mut delivered) = (0, 0u64);
        for _ in 0..3 {
            let mut job = JobClient::join(&name, &JobOptions::default()).unwrap();
            let slot = job.slot_index();
            let mut timed_ns = 0u128;
            for chunk in records.chunks(CHUNK) {
                let t = Instant::now();
                for r in chunk {
                    job.push(r);
                }
                job.flush();
                timed_ns += t.elapsed().as_nanos();
                coordinator.drain(slot, usize::MAX, |d| {
                    if matches!(d, Delivery::Record(_)) {
                        delivered += 1
                    }
                });
            }
            best = best.min(timed_ns as f64 / records.len() as f64);
            dropped += coordinator.jobs()[0].records_dropped;
            job.leave();
        }
        println!(
            "{accesses:>8}  {bytes:>12}  {:>7}  {best:>21.1}  {encode_ns:>17.1}  {dropped:>7}  {delivered:>9}",
            records.len()
        );
    }
}
