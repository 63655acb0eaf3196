//! `tensile status [--name NAME]`: the live jobs of each coordinator of this user, read from
//! their segments through a read-only mapping (status changes nothing).

use std::fmt::Write as _;

use tensile_analyzer::cost::format_bytes;
use tensile_protocol::segment::{list_names, user_prefix};
use tensile_protocol::{Admission, JobSnapshot, PlanState, SegmentError, SegmentView, SlotRoom};

use crate::coordinator::percent;

/// Arguments of `tensile status`.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// Only this coordinator (the name given to `tensile coordinator --name`).
    #[arg(long)]
    pub name: Option<String>,
}

/// Runs `tensile status`.
pub fn run(args: StatusArgs) -> Result<(), String> {
    print!("{}", render(args.name.as_deref())?);
    Ok(())
}

/// The report, or the one line that says why there is none.
pub fn render(name: Option<&str>) -> Result<String, String> {
    let names = match name {
        Some(n) => vec![n.to_string()],
        None => list_names(),
    };
    if names.is_empty() {
        return Ok(format!(
            "no coordinator is running (no {}/{}* segment)\n",
            tensile_protocol::shm::shm_dir_display(),
            user_prefix()
        ));
    }
    let mut out = String::new();
    for n in &names {
        match SegmentView::open(n) {
            Ok(view) => out.push_str(&segment_report(n, &view)),
            Err(SegmentError::NotFound { .. }) if name.is_some() => {
                return Err(format!("no coordinator named {n:?} is running"));
            }
            Err(e) if name.is_some() => return Err(e.to_string()),
            Err(e) => {
                let _ = writeln!(out, "coordinator {n}: {e}");
            }
        }
    }
    Ok(out)
}

fn segment_report(name: &str, view: &SegmentView) -> String {
    let mut out = String::new();
    let c = view.coordinator();
    let jobs: Vec<JobSnapshot> = view.jobs().into_iter().filter(|j| j.live).collect();
    let state = if c.running {
        format!(
            "pid {}, heartbeat {} ago",
            c.process.pid,
            format_ns(c.heartbeat_age_ns)
        )
    } else {
        format!(
            "pid {} is NOT running (a stale segment; the next job starts a new coordinator)",
            c.process.pid
        )
    };
    let _ = writeln!(
        out,
        "coordinator {name} ({state}): {} of {} job slots in use",
        jobs.len(),
        view.geometry().slot_count
    );
    if jobs.is_empty() {
        out.push_str("  no jobs\n");
        return out;
    }
    let card = jobs.iter().map(|j| j.card_bytes).max().unwrap_or(0);
    if card > 0 {
        let granted: u64 = jobs.iter().map(|j| j.grant_bytes).sum();
        let held: u64 = jobs.iter().map(|j| j.resident_bytes).sum();
        let _ = writeln!(
            out,
            "  card {}: {} granted, {} held by the jobs",
            format_bytes(card),
            format_bytes(granted),
            format_bytes(held)
        );
    }
    let header = [
        "PID",
        "PRIORITY",
        "LIMIT",
        "GRANT",
        "RESIDENT",
        "NEEDS",
        "FLOOR",
        "PLAN",
        "ROOM",
        "STALLS/STEP",
        "TO HOST/STEP",
        "TO DEVICE/STEP",
        "PREDICTED",
        "MEASURED",
        "COMMAND",
    ];
    let rows: Vec<[String; 15]> = jobs
        .iter()
        .map(|j| {
            [
                j.process.pid.to_string(),
                {
                    let priority = j.priority.map_or("?", |p| p.name());
                    // A further GPU of a process that takes its turns on its first GPU:
                    // never paused here.
                    if j.turns_elsewhere {
                        format!("{priority}, turns elsewhere")
                    } else {
                        priority.to_string()
                    }
                },
                if j.budget_bytes == 0 {
                    "card".to_string()
                } else {
                    format_bytes(j.budget_bytes)
                },
                format_bytes(j.grant_bytes),
                format_bytes(j.resident_bytes),
                format_bytes(j.demand_bytes),
                match j.admission {
                    Admission::Short => format!(
                        "{} SHORT (at most {})",
                        format_bytes(j.floor_bytes),
                        format_bytes(j.grantable_bytes)
                    ),
                    Admission::Admitted => format_bytes(j.floor_bytes),
                },
                plan_column(j),
                room_column(j),
                j.stalls_per_step.to_string(),
                format_bytes(j.bytes_to_host_per_step),
                format_bytes(j.bytes_to_device_per_step),
                optional_ns(j.predicted_step_ns),
                optional_ns(j.measured_step_ns),
                j.command_line.clone(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::from(" ");
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            // The command is last and left as long as it is.
            if i + 1 == cells.len() {
                let _ = write!(s, " {cell}");
            } else {
                let _ = write!(s, " {cell:>w$}");
            }
        }
        s.push('\n');
        s
    };
    out.push_str(&line(header.to_vec()));
    for row in &rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    let dropped: u64 = jobs.iter().map(|j| j.records_dropped).sum();
    let resets: u64 = jobs.iter().map(|j| j.ring_resets).sum();
    if dropped + resets > 0 {
        let _ = writeln!(
            out,
            "  events lost: {dropped} records dropped on full rings, {resets} corrupt rings reset"
        );
    }
    out
}

fn plan_column(j: &JobSnapshot) -> String {
    let plan = match j.plan_state {
        Some(PlanState::Learning) if j.plan_version == 0 => "learning".into(),
        Some(state) => format!("v{} {}", j.plan_version, state.name()),
        None => "?".into(),
    };
    if j.paused {
        format!("{plan}, waiting its turn")
    } else {
        plan
    }
}

/// The room the coordinator plans the job with ("-": it says none, as coordinators before the
/// field; "?": a word no version writes), and the one the job asks where that is not in force
/// yet.
fn room_column(j: &JobSnapshot) -> String {
    let in_force = match (j.room_in_force, j.room_in_force.share()) {
        (_, Some(room)) => percent(room),
        (SlotRoom::NotSaid, None) => "-".to_string(),
        (_, None) => "?".to_string(),
    };
    match j.room_asked.share() {
        Some(asked) if j.room_asked != j.room_in_force => {
            format!("{in_force} (asks {})", percent(asked))
        }
        _ => in_force,
    }
}

fn optional_ns(ns: u64) -> String {
    if ns == 0 {
        "-".into()
    } else {
        format_ns(ns)
    }
}

/// A duration in the unit its size calls for.
fn format_ns(ns: u64) -> String {
    match ns {
        0..1_000 => format!("{ns} ns"),
        1_000..1_000_000 => format!("{:.1} µs", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} ms", ns as f64 / 1e6),
        _ => format!("{:.2} s", ns as f64 / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_in_their_unit() {
        assert_eq!(format_ns(850), "850 ns");
        assert_eq!(format_ns(12_300), "12.3 µs");
        assert_eq!(format_ns(21_000_000), "21.0 ms");
        assert_eq!(format_ns(1_500_000_000), "1.50 s");
        assert_eq!(optional_ns(0), "-");
    }

    #[test]
    fn jobs_show_their_priority_grant_needs_floor_and_room_and_the_card_its_total() {
        use tensile_protocol::{CoordinatorSegment, Geometry, JobClient, JobOptions};
        let name = format!("test-status-{}", std::process::id());
        let segment = CoordinatorSegment::create(&name, Geometry::default()).unwrap();
        let job = JobClient::join(
            &name,
            &JobOptions {
                priority: tensile_protocol::Priority::High,
                command_line: "train.py".into(),
                ..JobOptions::default()
            },
        )
        .unwrap();
        job.set_card_bytes(80 << 30);
        job.set_memory(6 << 30, 9 << 30);
        segment.set_grant(job.slot_index(), 7 << 30);
        segment.set_admission(job.slot_index(), Admission::Short, 12 << 30, 10 << 30);
        let incarnation = segment.jobs()[0].incarnation;
        segment.set_room_in_force(job.slot_index(), incarnation, SlotRoom::Permille(200));
        job.ask_room(0.3);
        let other_gpu = JobClient::join(
            &name,
            &JobOptions {
                priority: tensile_protocol::Priority::Low,
                command_line: "two_gpus.py".into(),
                turns_elsewhere: true,
                ..JobOptions::default()
            },
        )
        .unwrap();
        let text = render(Some(&name)).unwrap();
        let row = text.lines().find(|l| l.contains("two_gpus.py")).unwrap();
        assert!(row.contains("low, turns elsewhere"), "{row:?}");
        other_gpu.leave();
        assert!(
            text.contains("card 80.00 GiB: 7.00 GiB granted, 6.00 GiB held by the jobs"),
            "{text}"
        );
        let row = text.lines().find(|l| l.contains("train.py")).unwrap();
        for cell in [
            "high",
            "card",
            "7.00 GiB",
            "6.00 GiB",
            "9.00 GiB",
            "12.00 GiB SHORT (at most 10.00 GiB)",
            "20% (asks 30%)",
        ] {
            assert!(row.contains(cell), "{cell:?} not in {row:?}");
        }
        job.leave();
    }

    #[test]
    fn a_named_coordinator_that_is_not_running_is_one_line() {
        let err = render(Some("surely-not-running-here")).unwrap_err();
        assert_eq!(
            err,
            "no coordinator named \"surely-not-running-here\" is running"
        );
    }
}
