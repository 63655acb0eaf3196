//! The executor's trigger logic over a real tracker and a recording mover.

use std::sync::Mutex;

use tensile_protocol::plan::{Iteration, Role, Use};
use tensile_trace::AllocKind;

use super::*;
use crate::kernels::Introspection;
use crate::params::ParamLayout;
use crate::tracker::LaunchShape;

const PAGE: u64 = PAGE_BYTES;

/// One verb call: which verb, on which ranges.
type Call = (Verb, Vec<(u64, usize)>);

#[derive(Default)]
struct Recording {
    calls: Mutex<Vec<Call>>,
    unit_pages: Mutex<Vec<Option<usize>>>,
}

impl Mover for Recording {
    fn swap_out(&self, ranges: &[(u64, usize)]) -> Result<usize, CUresult> {
        self.calls
            .lock()
            .unwrap()
            .push((Verb::SwapOut, ranges.to_vec()));
        Ok(ranges.iter().map(|r| r.1 / PAGE as usize).sum())
    }
    fn prefetch(&self, ranges: &[(u64, usize)]) -> Result<usize, CUresult> {
        self.calls
            .lock()
            .unwrap()
            .push((Verb::Prefetch, ranges.to_vec()));
        Ok(ranges.len())
    }
    fn set_unit_pages(&self, pages: Option<usize>) {
        self.unit_pages.lock().unwrap().push(pages);
    }
}

fn kernel(id: u32, name: &str) -> &'static KernelMeta {
    Box::leak(Box::new(KernelMeta {
        id,
        name: name.into(),
        layout: ParamLayout::new(vec![]),
    }))
}

const SHAPE: LaunchShape = LaunchShape {
    grid: [1, 1, 1],
    block: [1, 1, 1],
    shared_mem_bytes: 0,
    stream: 0,
};

/// A launch as the hook makes it: before, number, after.
fn launch(e: &Executor, t: &Tracker, k: &KernelMeta) -> u64 {
    e.before_launch(t, k, || false);
    let seq = t.launched(None, 0, k, SHAPE, &[]);
    e.after_launch(t, k, seq, || false);
    seq
}

fn alloc(e: &Executor, t: &Tracker, ptr: u64, bytes: u64) -> u64 {
    let id = t.allocated(None, 0, 0, ptr, bytes, AllocKind::Async);
    e.allocated(t, id, ptr, bytes);
    id
}

fn step(position: u32, when: When, action: Action, role: Role, offset: u64, bytes: u64) -> Step {
    Step {
        position,
        when,
        action,
        piece: PieceRef {
            role,
            offset,
            bytes,
        },
    }
}

fn plan(kernels: Vec<u32>, steps: Vec<Step>) -> ExecPlan {
    ExecPlan {
        version: 7,
        period: kernels.len() as u32,
        kernels,
        anchor_seq: 0,
        steps,
        uses: vec![],
        host_resident: vec![],
        budget_bytes: 0,
        predicted_step_ns: 0,
        compute_ns: 0,
    }
}

fn calls(m: &Recording, e: &Executor) -> Vec<Call> {
    assert!(e.flush());
    std::mem::take(&mut *m.calls.lock().unwrap())
}

#[test]
fn steps_run_at_their_positions_on_the_roles_of_each_iteration() {
    let mover = Arc::new(Recording::default());
    let e = Executor::new(mover.clone());
    let t = Tracker::new(Introspection::default());
    let (a, b) = (kernel(1, "a"), kernel(2, "b"));
    let act = Role::Transient {
        ordinal: 1,
        bytes: 6 * PAGE,
        iteration: Iteration::Current,
    };
    // Iteration: a (allocates nothing), b, a. The activation (ordinal 1: the weight is
    // ordinal 0 in iteration 0, the input in later ones) leaves after position 1 and comes
    // back before position 2. Its first and last pages are shared with its neighbours: the
    // swap-out moves the 5 pages in between, the prefetch covers all 7.
    let p = plan(
        vec![1, 2, 1],
        vec![
            step(1, When::AfterLaunch, Action::SwapOut, act, 0, 6 * PAGE),
            step(2, When::BeforeLaunch, Action::Prefetch, act, 0, 6 * PAGE),
        ],
    );
    e.install(p, &t);
    assert_eq!(e.state(), ExecutorState::Planned { version: 7 });
    let base = 0x7000_0000_0000u64;
    for it in 0..3u64 {
        let at = base + it * 0x1_0000_0000;
        // Iteration 0: the weight (persistent); later ones: that iteration's input.
        alloc(&e, &t, at, PAGE / 4);
        let act_at = at + PAGE / 2;
        alloc(&e, &t, act_at, 6 * PAGE);
        launch(&e, &t, a);
        launch(&e, &t, b);
        assert_eq!(
            calls(&mover, &e),
            vec![(Verb::SwapOut, vec![(at + PAGE, 5 * PAGE as usize)])],
            "iteration {it}"
        );
        launch(&e, &t, a);
        assert_eq!(
            calls(&mover, &e),
            vec![(Verb::Prefetch, vec![(act_at, 6 * PAGE as usize)])],
            "iteration {it}"
        );
        // The activation is freed; the next iteration's has another address.
        let r = t.begin_free(act_at).unwrap();
        t.end_free(None, 0, 0, r, true);
    }
    let s = e.stats();
    assert_eq!((s.steps_done, s.steps_skipped, s.mismatches), (6, 0, 0));
    assert_eq!((s.pages_out, s.pages_in), (15, 3));
}

#[test]
fn units_are_asked_no_larger_than_the_whole_pages_of_every_piece_and_freed_with_the_plan() {
    let act = |bytes| Role::Transient {
        ordinal: 1,
        bytes,
        iteration: Iteration::Current,
    };
    let out =
        |role, offset, bytes| step(0, When::AfterLaunch, Action::SwapOut, role, offset, bytes);
    // Pieces of 8 pages from offset 0, and a last one of 4 pages and a half: its whole pages
    // are 4.
    let pieces = plan(
        vec![1, 2],
        vec![
            out(act(20 * PAGE + PAGE / 2), 0, 8 * PAGE),
            out(act(20 * PAGE + PAGE / 2), 8 * PAGE, 8 * PAGE),
            out(act(20 * PAGE + PAGE / 2), 16 * PAGE, 4 * PAGE + PAGE / 2),
        ],
    );
    assert_eq!(unit_pages(&pieces, PAGE), Some(4));
    // A piece starting inside a page: its whole pages start at the next one.
    let odd = plan(
        vec![1],
        vec![out(act(9 * PAGE), PAGE / 2, 6 * PAGE + PAGE / 2)],
    );
    assert_eq!(unit_pages(&odd, PAGE), Some(1));
    // No whole page moves: no limit asked.
    let small = plan(vec![1], vec![out(act(PAGE), 0, PAGE / 2)]);
    assert_eq!(unit_pages(&small, PAGE), None);

    let mover = Arc::new(Recording::default());
    let e = Executor::new(mover.clone());
    let t = Tracker::new(Introspection::default());
    let (a, c) = (kernel(1, "a"), kernel(3, "c"));
    assert!(e.install(pieces, &t));
    // Position 1 wants kernel 2: c drops the plan.
    launch(&e, &t, a);
    launch(&e, &t, c);
    // Asked: never below `MIN_UNIT_PAGES` (a unit's calls cost per mapping).
    assert_eq!(
        *mover.unit_pages.lock().unwrap(),
        vec![Some(MIN_UNIT_PAGES.max(4)), None]
    );
}

#[test]
fn a_kernel_mismatch_drops_the_plan_and_nothing_more_runs() {
    let mover = Arc::new(Recording::default());
    let e = Executor::new(mover.clone());
    let t = Tracker::new(Introspection::default());
    let (a, b, c) = (kernel(1, "a"), kernel(2, "b"), kernel(3, "c"));
    let w = Role::Persistent { alloc_id: 1 };
    alloc(&e, &t, 0x7000_0000_0000, 2 * PAGE);
    e.install(
        plan(
            vec![1, 2],
            vec![step(1, When::AfterLaunch, Action::SwapOut, w, 0, 2 * PAGE)],
        ),
        &t,
    );
    launch(&e, &t, a);
    launch(&e, &t, b);
    assert_eq!(calls(&mover, &e).len(), 1);
    launch(&e, &t, a);
    launch(&e, &t, c); // position 1 expects b
    launch(&e, &t, a);
    launch(&e, &t, b);
    assert!(calls(&mover, &e).is_empty());
    assert_eq!(e.state(), ExecutorState::Fallback { version: 7 });
    let s = e.stats();
    assert_eq!(
        (s.mismatches, s.plans_dropped, s.plans_loaded, s.steps_done),
        (1, 1, 1, 1)
    );
}

#[test]
fn roles_that_do_not_resolve_are_skipped_and_counted() {
    let mover = Arc::new(Recording::default());
    let e = Executor::new(mover.clone());
    let t = Tracker::new(Introspection::default());
    let a = kernel(1, "a");
    let steps = vec![
        // Ordinal 5 never exists.
        step(
            0,
            When::AfterLaunch,
            Action::Prefetch,
            Role::Transient {
                ordinal: 5,
                bytes: PAGE,
                iteration: Iteration::Current,
            },
            0,
            PAGE,
        ),
        // Ordinal 0 has another size.
        step(
            0,
            When::AfterLaunch,
            Action::SwapOut,
            Role::Transient {
                ordinal: 0,
                bytes: 4 * PAGE,
                iteration: Iteration::Current,
            },
            0,
            4 * PAGE,
        ),
        // No allocation 99.
        step(
            0,
            When::AfterLaunch,
            Action::SwapOut,
            Role::Persistent { alloc_id: 99 },
            0,
            PAGE,
        ),
        // Ordinal 0 of the previous iteration: iteration 0 has none.
        step(
            0,
            When::AfterLaunch,
            Action::Prefetch,
            Role::Transient {
                ordinal: 0,
                bytes: 2 * PAGE,
                iteration: Iteration::Previous,
            },
            0,
            PAGE,
        ),
        // Less than a page: nothing whole to swap out.
        step(
            0,
            When::AfterLaunch,
            Action::SwapOut,
            Role::Transient {
                ordinal: 0,
                bytes: 2 * PAGE,
                iteration: Iteration::Current,
            },
            PAGE / 2,
            PAGE,
        ),
    ];
    e.install(plan(vec![1], steps), &t);
    alloc(&e, &t, 0x7000_0000_0000, 2 * PAGE);
    launch(&e, &t, a);
    assert!(calls(&mover, &e).is_empty());
    let s = e.stats();
    assert_eq!((s.steps_skipped, s.steps_done), (5, 0));
    assert_eq!(e.state(), ExecutorState::Planned { version: 7 });
}

#[test]
fn a_plan_installed_mid_iteration_waits_for_a_whole_iteration() {
    let mover = Arc::new(Recording::default());
    let e = Executor::new(mover.clone());
    let t = Tracker::new(Introspection::default());
    let (a, b) = (kernel(1, "a"), kernel(2, "b"));
    let act = Role::Transient {
        ordinal: 0,
        bytes: 2 * PAGE,
        iteration: Iteration::Current,
    };
    launch(&e, &t, a);
    e.install(
        plan(
            vec![1, 2],
            vec![step(
                1,
                When::AfterLaunch,
                Action::SwapOut,
                act,
                0,
                2 * PAGE,
            )],
        ),
        &t,
    );
    // Launch 1 (position 1, a wrong kernel) is before the plan applies: not checked.
    launch(&e, &t, a);
    // Iteration 1 (launches 2, 3) is the first whole one.
    alloc(&e, &t, 0x7000_0000_0000, 2 * PAGE);
    launch(&e, &t, a);
    launch(&e, &t, b);
    assert_eq!(
        calls(&mover, &e),
        vec![(Verb::SwapOut, vec![(0x7000_0000_0000, 2 * PAGE as usize)])]
    );
    assert_eq!(e.stats().mismatches, 0);
}

/// Plans 7 and 8 over one iteration of kernels a, b, c, learned at different phases: 7's
/// starts at a and swaps `w1` out after b; 8's starts at c (launch 2) and swaps `w2` out
/// after it. Returns the executor, its mover, the tracker, the kernels and where each
/// allocation is, with plan 7 installed and launches 0 to 3 made.
fn plans_at_two_phases() -> (
    Executor,
    Arc<Recording>,
    Tracker,
    [&'static KernelMeta; 3],
    ExecPlan,
    [u64; 2],
) {
    let mover = Arc::new(Recording::default());
    let e = Executor::new(mover.clone());
    let t = Tracker::new(Introspection::default());
    let k = [kernel(1, "a"), kernel(2, "b"), kernel(3, "c")];
    let at = [0x7000_0000_0000, 0x7100_0000_0000];
    let w1 = Role::Persistent {
        alloc_id: alloc(&e, &t, at[0], 2 * PAGE),
    };
    let w2 = Role::Persistent {
        alloc_id: alloc(&e, &t, at[1], 2 * PAGE),
    };
    e.install(
        plan(
            vec![1, 2, 3],
            vec![step(1, When::AfterLaunch, Action::SwapOut, w1, 0, 2 * PAGE)],
        ),
        &t,
    );
    let mut relearned = plan(
        vec![3, 1, 2],
        vec![step(0, When::AfterLaunch, Action::SwapOut, w2, 0, 2 * PAGE)],
    );
    relearned.version = 8;
    relearned.anchor_seq = 2;
    for kernel in [k[0], k[1], k[2], k[0]] {
        launch(&e, &t, kernel);
    }
    assert_eq!(calls(&mover, &e).len(), 1, "plan 7 ran at launch 1");
    (e, mover, t, k, relearned, at)
}

#[test]
fn a_plan_stays_in_force_until_the_one_replacing_it_starts() {
    let (e, mover, t, [a, b, c], relearned, [w1, w2]) = plans_at_two_phases();
    // Plan 8's iteration starts at launch 5 (a c): launch 4 is still plan 7's.
    e.install(relearned, &t);
    assert_eq!(e.state(), ExecutorState::Planned { version: 8 });
    let out = |at: u64| vec![(Verb::SwapOut, vec![(at, 2 * PAGE as usize)])];
    launch(&e, &t, b);
    assert_eq!(calls(&mover, &e), out(w1), "plan 7 at launch 4");
    launch(&e, &t, c);
    assert_eq!(calls(&mover, &e), out(w2), "plan 8 from launch 5");
    // From there on plan 8 only: b (launch 7) moves nothing.
    for kernel in [a, b] {
        launch(&e, &t, kernel);
    }
    assert!(calls(&mover, &e).is_empty());
    launch(&e, &t, c);
    assert_eq!(calls(&mover, &e), out(w2));
    let s = e.stats();
    assert_eq!((s.plans_loaded, s.mismatches, s.steps_done), (2, 0, 4));
}

#[test]
fn an_outgoing_plan_that_stops_matching_leaves_alone() {
    let (e, mover, t, [a, _, c], relearned, [_, w2]) = plans_at_two_phases();
    e.install(relearned, &t);
    // Launch 4 is plan 7's b: an a drops plan 7, and plan 8 still starts at launch 5.
    launch(&e, &t, a);
    assert!(calls(&mover, &e).is_empty());
    assert_eq!(e.state(), ExecutorState::Planned { version: 8 });
    launch(&e, &t, c);
    assert_eq!(
        calls(&mover, &e),
        vec![(Verb::SwapOut, vec![(w2, 2 * PAGE as usize)])]
    );
    let s = e.stats();
    assert_eq!((s.mismatches, s.plans_dropped), (1, 1));
}

#[test]
fn host_resident_pieces_leave_once_at_the_first_iteration() {
    let mover = Arc::new(Recording::default());
    let e = Executor::new(mover.clone());
    let t = Tracker::new(Introspection::default());
    let a = kernel(1, "a");
    let id = alloc(&e, &t, 0x7000_0000_0000, 4 * PAGE);
    let mut p = plan(vec![1], vec![]);
    p.host_resident = vec![PieceRef {
        role: Role::Persistent { alloc_id: id },
        offset: 0,
        bytes: 4 * PAGE,
    }];
    e.install(p, &t);
    for _ in 0..3 {
        launch(&e, &t, a);
    }
    assert_eq!(
        calls(&mover, &e),
        vec![(Verb::SwapOut, vec![(0x7000_0000_0000, 4 * PAGE as usize)])]
    );
}

#[test]
fn a_plan_that_breaks_the_rules_is_refused_and_the_old_one_goes_on() {
    let mover = Arc::new(Recording::default());
    let e = Executor::new(mover.clone());
    let t = Tracker::new(Introspection::default());
    let w = Role::Persistent { alloc_id: 1 };
    alloc(&e, &t, 0x7000_0000_0000, 2 * PAGE);
    assert!(e.install(
        plan(
            vec![1],
            vec![step(0, When::AfterLaunch, Action::SwapOut, w, 0, 2 * PAGE)]
        ),
        &t
    ));
    let mut unordered = plan(
        vec![1, 1],
        vec![
            step(1, When::AfterLaunch, Action::SwapOut, w, 0, 2 * PAGE),
            step(0, When::AfterLaunch, Action::SwapOut, w, 0, 2 * PAGE),
        ],
    );
    unordered.version = 8;
    assert!(!e.install(unordered, &t));
    assert_eq!(e.state(), ExecutorState::Planned { version: 7 });
    launch(&e, &t, kernel(1, "a"));
    assert_eq!(calls(&mover, &e).len(), 1);
    assert_eq!(e.stats().plans_loaded, 1);
}

#[test]
fn the_advice_counts_launches_to_each_pages_next_use_in_the_plan() {
    let e = Executor::new(Arc::new(Recording::default()));
    let t = Tracker::new(Introspection::default());
    let (a, b) = (kernel(1, "a"), kernel(2, "b"));
    let base = 0x7000_0000_0000u64;
    let w = alloc(&e, &t, base, PAGE);
    // Made before the plan and named by none of its roles.
    alloc(&e, &t, base + 0x2000_0000, PAGE);
    let act = Role::Transient {
        ordinal: 0,
        bytes: 2 * PAGE,
        iteration: Iteration::Current,
    };
    let weight = Role::Persistent { alloc_id: w };
    let used = |position, role| Use { position, role };
    let mut p = plan(vec![1, 2, 1], vec![]);
    p.uses = vec![used(0, weight), used(1, act), used(2, weight), used(2, act)];
    let pages = |e: &Executor, act_at: u64| {
        let mut out = Vec::new();
        // The weight's page, the activation's two, a page holding nothing, the unnamed one.
        let asked = [
            base,
            act_at,
            act_at + PAGE,
            base + 0x4000_0000,
            base + 0x2000_0000,
        ];
        assert!(e.next_uses(&t, &asked, PAGE, &mut out));
        out
    };
    let mut out = Vec::new();
    assert!(
        !e.next_uses(&t, &[base], PAGE, &mut out),
        "advice without a plan"
    );
    e.install(p, &t);
    let act_at = base + 0x1_0000_0000;
    alloc(&e, &t, act_at, 2 * PAGE);
    let (never, unknown) = (NextUse::Never, NextUse::Unknown);
    assert_eq!(
        pages(&e, act_at),
        vec![
            NextUse::In(0),
            NextUse::In(1),
            NextUse::In(1),
            never,
            unknown
        ]
    );
    launch(&e, &t, a);
    assert_eq!(
        pages(&e, act_at),
        vec![
            NextUse::In(1),
            NextUse::In(0),
            NextUse::In(0),
            never,
            unknown
        ]
    );
    launch(&e, &t, b);
    launch(&e, &t, a);
    // The next iteration: the weight is next used by its first launch; the activation of
    // the iteration before is used no more.
    assert_eq!(
        pages(&e, act_at),
        vec![NextUse::In(0), never, never, never, unknown]
    );
}

#[test]
fn a_prefetch_asks_for_its_pieces_one_at_a_time_in_order() {
    let mover = Arc::new(Recording::default());
    let worker = Worker::start(mover.clone(), Arc::new(Counters::default())).unwrap();
    let (a, b, c) = (1 << 30, 2 << 30, 3 << 30);
    let ranges = vec![
        (b, 40 * PAGE as usize),
        (a, PAGE as usize),
        (c, 3 * PAGE as usize),
    ];
    assert!(worker.send(Job {
        verb: Verb::Prefetch,
        ranges: ranges.clone(),
        steps: 3,
        seq: 0,
        queued: std::time::Instant::now(),
    }));
    assert!(worker.flush(std::time::Duration::from_secs(5)));
    let calls = mover.calls.lock().unwrap().clone();
    let each: Vec<Call> = ranges.iter().map(|&r| (Verb::Prefetch, vec![r])).collect();
    assert_eq!(
        calls, each,
        "one call per piece, in the plan's order, none cut"
    );
    // Swap-outs go as they are.
    assert!(worker.send(Job {
        verb: Verb::SwapOut,
        ranges: ranges.clone(),
        steps: 3,
        seq: 0,
        queued: std::time::Instant::now(),
    }));
    assert!(worker.flush(std::time::Duration::from_secs(5)));
    assert_eq!(
        mover.calls.lock().unwrap().last(),
        Some(&(Verb::SwapOut, ranges))
    );
}
