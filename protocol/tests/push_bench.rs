//! What a job pays per record on its push path (encode into the batch, write frames), with a
//! coordinator thread draining as it would. A benchmark, not a test: run with
//! `cargo test -p tensile-protocol --release --test push_bench -- --ignored --nocapture`.

use std::sync::atomic::{AtomicBool, Ordering};
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
    let name = format!("bench-push-{}", std::process::id());
    let mut coordinator = CoordinatorSegment::create(&name, Geometry::default()).unwrap();
    println!("accesses  records    ns/record  dropped  delivered");
    for accesses in [0usize, 4, 16] {
        let records: Vec<Record> = (0..200_000).map(|s| launch(s, accesses)).collect();
        let mut job = JobClient::join(&name, &JobOptions::default()).unwrap();
        let slot = job.slot_index();
        let done = AtomicBool::new(false);
        let mut delivered = 0u64;
        let ns = std::thread::scope(|s| {
            let c = &mut coordinator;
            let done = &done;
            let delivered = &mut delivered;
            s.spawn(move || loop {
                let finished = done.load(Ordering::Acquire);
                c.drain(slot, usize::MAX, |d| {
                    if matches!(d, Delivery::Record(_)) {
                        *delivered += 1
                    }
                });
                if finished {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            });
            let t = Instant::now();
            for r in &records {
                job.push(r);
            }
            job.flush();
            let ns = t.elapsed().as_nanos() as f64 / records.len() as f64;
            done.store(true, Ordering::Release);
            ns
        });
        let dropped = coordinator.jobs()[0].records_dropped;
        println!(
            "{accesses:>8}  {:>7}  {ns:>11.1}  {dropped:>7}  {delivered:>9}",
            records.len()
        );
        job.leave();
    }
}
