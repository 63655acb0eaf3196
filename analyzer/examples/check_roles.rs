//! Learns the first plan from a trace in the project's own format as the library's planning
//! thread would (the online learner, polled after every launch), then checks the plan's uses
//! against the rest of the trace: per iteration after the plan, how many of the allocations its
//! uses name by role (ordinal and size) are not what the launch at their position touches.
//! A plan whose roles name other tensors than the run's moves the wrong pieces.
//!
//! ```text
//! cargo run --release -p tensile-analyzer --example check_roles -- TRACE BUDGET_MIB
//! ```
use std::collections::HashMap;
use tensile_analyzer::online::{Learner, LearnerOptions};
use tensile_protocol::plan::{Iteration, Role};
use tensile_trace::{Reader, Record};

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [trace, budget] = args.as_slice() else {
        return Err("usage: check_roles TRACE BUDGET_MIB".into());
    };
    let budget: u64 = budget
        .parse()
        .map_err(|e| format!("budget {budget:?}: {e}"))?;
    let reader = Reader::open(trace).map_err(|e| format!("{trace}: {e}"))?;
    let mut learner = Learner::new(LearnerOptions::for_budget(budget << 20));
    let mut plan = None;
    let mut next_seq: i64 = 0;
    let mut tables: HashMap<i64, Vec<(u64, u64)>> = HashMap::new();
    let mut bad: HashMap<i64, (u32, u32)> = HashMap::new();
    let mut records = 0;
    let mut first_iteration = None;
    for item in reader {
        let record = item.map_err(|e| format!("{trace}: {e}"))?;
        records += 1;
        if plan.is_none() {
            learner.push(&record);
            if matches!(record, Record::Launch(_)) {
                if let Some(p) = learner.poll() {
                    println!(
                        "record {records}: plan v{} period {} anchor {} steps {} uses {} window_ops {:?}",
                        p.version, p.period, p.anchor_seq, p.steps.len(), p.uses.len(),
                        learner.last_poll_cost().map(|c| c.window_ops)
                    );
                    plan = Some(p);
                }
            }
        }
        let Some(p) = &plan else {
            if let Record::Launch(l) = &record {
                next_seq = l.seq as i64 + 1;
            }
            continue;
        };
        let (anchor, period) = (p.anchor_seq as i64, p.period as i64);
        match &record {
            Record::Alloc(al) => {
                let it = (next_seq - anchor).div_euclid(period);
                tables.entry(it).or_default().push((al.id, al.bytes));
            }
            Record::Launch(l) => {
                next_seq = l.seq as i64 + 1;
                let it = (l.seq as i64 - anchor).div_euclid(period);
                let pos = (l.seq as i64 - anchor).rem_euclid(period) as u32;
                // The tables are whole from the second iteration after the plan, and a launch
                // of another kernel is another pattern.
                let first = *first_iteration.get_or_insert(it);
                if it < first + 2 || p.kernels.get(pos as usize) != Some(&l.kernel) {
                    continue;
                }
                for u in p.uses.iter().filter(|u| u.position == pos) {
                    let Role::Transient {
                        ordinal,
                        bytes,
                        iteration,
                    } = u.role
                    else {
                        continue;
                    };
                    let of = if iteration == Iteration::Current {
                        it
                    } else {
                        it - 1
                    };
                    let ok = tables
                        .get(&of)
                        .and_then(|t| t.get(ordinal as usize))
                        .is_some_and(|&(id, b)| {
                            b == bytes && l.accesses.iter().any(|x| x.alloc == id)
                        });
                    let e = bad.entry(it).or_default();
                    e.0 += 1;
                    e.1 += u32::from(!ok);
                    if !ok && std::env::var_os("CHECK_ROLES_SHOW").is_some() {
                        println!("iteration {it} position {pos}: {:?} not touched", u.role);
                    }
                }
            }
            _ => {}
        }
    }
    let mut v: Vec<_> = bad.into_iter().collect();
    v.sort();
    println!("iteration: transient uses checked, naming another allocation");
    for (iteration, (checked, wrong)) in v {
        println!("{iteration:>9}: {checked:>6} {wrong:>6}");
    }
    Ok(())
}
