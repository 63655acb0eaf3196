//! The schedule term of the lower bound: a linear program over *when* bytes can cross PCIe.
//!
//! The other terms of [`crate::bound`] price each op alone (the window term) or count bytes
//! without asking when they can move (the packing term). This one does both at once: it is a
//! time-indexed relaxation of every plan, solved as a linear program. It is not the planner and
//! does not produce a plan; it answers "how fast could any plan be", so that a plan can be
//! judged against it (docs/planner.md, "The schedule LP", has the derivation).
//!
//! The iteration is cut into *phases* of consecutive ops (one op each when the LP is small
//! enough; see [`ops_per_phase`]). Variables:
//! - `tau[k]`: wall-clock length of phase `k`, at least the compute time of its ops;
//! - for every live gap `g` (a tensor between two accesses) and every phase it spans:
//!   `o[g][k]` bytes written out and `n[g][k]` read back during phase `k`, and `z[g][k]` bytes
//!   of the gap off the device at the end of phase `k`, with `0 <= z <= size` and
//!   `z[k] = z[k-1] + o[k] - n[k]` (a byte comes back only after it left, and a gap ends with
//!   everything back on the device).
//!
//! Constraints: in each phase the copy engines move at most `B_out * tau` out, `B_in * tau` in
//! and `B_both * tau` together; a gap opened by op `a` writes out only after op `a` ends; and at
//! the start of every op `i` the gaps spanning it have at least `e[i]` bytes off the device (the
//! excess of data over the budget, beyond what never-touched tensors cover). Inside a phase the
//! bytes off at op `i` are not variables of their own; they are bounded above by
//! `z[k-1] + o[k]` and by `z[k] + n[k]`, and the constraint is imposed with each bound (both are
//! relaxations). The objective is the sum of the `tau`: the step time.
//!
//! Any plan's steady state, averaged over iterations, is a feasible point (its copies, split by
//! phase, satisfy every constraint), so the LP optimum is a lower bound on the long-run step
//! time. It is a *relaxation*: copies are fluid (a tensor may be partly away, and a copy in
//! flight counts as partly done, where the simulator holds a whole tensor's memory for its
//! whole copy), and the two engines are not FIFO queues.
//!
//! Built only with the `lp` feature (the default): the shim's in-process learner leaves the
//! solver out, and the bound then goes without this term.
//!
//! The LP is solved with Clarabel (an interior-point solver, pure Rust). The value reported is
//! not the solver's objective but a **certificate** ([`certified_value`]): the solver's dual
//! vector is clipped to the dual cone, repaired until every reduced cost is provably
//! non-negative (raising the multipliers of the engine and cap rows, then scaling), and the dual
//! objective of the repaired vector is evaluated with every floating-point rounding bounded
//! against it. By weak duality that value is at most the LP optimum, whatever the solver's
//! accuracy; a poor dual vector only makes it lower. `TENSILE_LP_VERBOSE=1` in the
//! environment prints the solver's iterations to stdout (for looking into a slow or failed solve).

#[cfg(feature = "lp")]
use std::time::Instant;

#[cfg(feature = "lp")]
use clarabel::algebra::CscMatrix;
#[cfg(feature = "lp")]
use clarabel::solver::{
    DefaultSettingsBuilder, DefaultSolver, IPSolver, SolverStatus, SupportedConeT,
};
use serde::Serialize;

#[cfg(feature = "lp")]
use crate::cost::CostModel;
#[cfg(feature = "lp")]
use crate::cycle::Cycle;
use crate::cycle::TensorId;
use crate::timeline::Liveness;

/// Largest LP (in variables) the bound builds by default: about a second to solve on one core.
pub const DEFAULT_MAX_VARIABLES: usize = 40_000;

/// What the schedule LP found.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ScheduleBound {
    /// The least step time of any plan, by this relaxation.
    pub bound_ns: u64,
    /// Ops per phase the iteration was cut into (1: every op boundary is a phase boundary).
    pub ops_per_phase: u32,
    /// Variables of the LP.
    pub variables: usize,
    /// Wall-clock time spent building and solving it.
    pub solve_ms: u64,
}

/// One gap as the LP sees it: its bytes and its first and last phase (unrolled).
struct GapSpan {
    #[cfg_attr(not(feature = "lp"), allow(dead_code))]
    bytes: f64,
    /// Unrolled position of the access that opens the gap.
    from: u32,
    /// Unrolled position of the access that closes it.
    to: u32,
}

/// Phases of `k` ops each, numbered continuously across iterations (unrolled).
#[derive(Clone, Copy)]
struct Phases {
    period: u32,
    k: u32,
    count: u32,
}

impl Phases {
    fn new(period: u32, k: u32) -> Phases {
        Phases {
            period,
            k,
            count: period.div_ceil(k),
        }
    }

    /// Unrolled phase of the segment that starts at unrolled op position `s` (the op and the
    /// idle time after it, until the next op starts).
    fn of(&self, s: u32) -> u32 {
        (s / self.period) * self.count + (s % self.period) / self.k
    }

    /// Whether unrolled op `s` starts a phase.
    #[cfg(feature = "lp")]
    fn starts_phase(&self, s: u32) -> bool {
        (s % self.period).is_multiple_of(self.k)
    }

    /// Phases a gap spans (its segments run from `from` to `to - 1`).
    fn spanned(&self, g: &GapSpan) -> u32 {
        self.of(g.to - 1) - self.of(g.from) + 1
    }
}

/// The fewest ops per phase, up to `max_ops_per_phase`, whose LP has at most `max_variables`
/// variables; `None` if even that many ops per phase are too many variables.
pub fn ops_per_phase(live: &Liveness, max_variables: usize, max_ops_per_phase: u32) -> Option<u32> {
    let spans = gap_spans(live, |_| 0.0);
    let period = live.period.max(1);
    (1..=period.min(max_ops_per_phase)).find(|&k| {
        let ph = Phases::new(period, k);
        variable_count(&ph, &spans) <= max_variables
    })
}

/// The gaps that span at least one op (the others can never be off the device while an op
/// runs), with their sizes as `bytes` gives them.
fn gap_spans(live: &Liveness, bytes: impl Fn(TensorId) -> f64) -> Vec<GapSpan> {
    live.gaps
        .iter()
        .filter(|g| g.to - g.from >= 2)
        .map(|g| GapSpan {
            bytes: bytes(g.tensor),
            from: g.from,
            to: g.to,
        })
        .collect()
}

fn variable_count(ph: &Phases, spans: &[GapSpan]) -> usize {
    ph.count as usize
        + spans
            .iter()
            .map(|g| 3 * ph.spanned(g) as usize - 1)
            .sum::<usize>()
}

/// Triplets of a sparse matrix, row by row as constraints are added.
#[cfg(feature = "lp")]
#[derive(Default)]
struct Rows {
    i: Vec<usize>,
    j: Vec<usize>,
    v: Vec<f64>,
    rhs: Vec<f64>,
}

#[cfg(feature = "lp")]
impl Rows {
    /// Adds the row `sum coef * x[col] (=|<=) rhs`.
    fn push(&mut self, terms: impl IntoIterator<Item = (usize, f64)>, rhs: f64) {
        let r = self.rhs.len();
        for (col, coef) in terms {
            self.i.push(r);
            self.j.push(col);
            self.v.push(coef);
        }
        self.rhs.push(rhs);
    }
}

/// Solves the schedule LP for `cycle`, whose ops must have `excess[i]` bytes of touched data off
/// the device, with phases of `ops_per_phase` ops. `None` when there is nothing to bound (no
/// excess) or the solver did not reach an optimum (the term is then left out, not guessed).
#[cfg(feature = "lp")]
pub fn schedule_bound(
    cycle: &Cycle,
    live: &Liveness,
    excess: &[u64],
    cost: &CostModel,
    ops_per_phase: u32,
) -> Option<ScheduleBound> {
    let started = Instant::now();
    let period = cycle.len() as u32;
    if period == 0 || excess.iter().all(|&e| e == 0) {
        return None;
    }
    // Units: MiB and ms keep the coefficients within a few orders of magnitude of 1.
    const MIB: f64 = (1u64 << 20) as f64;
    let per_ms = |gbps: f64| gbps * 1e6 / MIB;
    let (b_out, b_in, b_both) = (
        per_ms(cost.d2h_gbps),
        per_ms(cost.h2d_gbps),
        per_ms(cost.bidir_gbps),
    );
    let ph = Phases::new(period, ops_per_phase.clamp(1, period));
    let nph = ph.count as usize;
    let spans = gap_spans(live, |t| cycle.tensors[t as usize].bytes as f64 / MIB);

    // Column layout: tau[0..nph], then per gap o[0..L], n[0..L], z[0..L-1].
    let mut cols = nph;
    let mut eq = Rows::default();
    let mut ineq = Rows::default();
    let mut outs_in_phase: Vec<Vec<usize>> = vec![Vec::new(); nph];
    let mut ins_in_phase: Vec<Vec<usize>> = vec![Vec::new(); nph];
    // Write-outs in a gap's first phase, grouped by the op opening the gap.
    let mut first_outs: Vec<Vec<usize>> = vec![Vec::new(); period as usize];
    // Per op: the two relaxed "bytes off at op i" sums.
    let mut off_a: Vec<Vec<usize>> = vec![Vec::new(); period as usize];
    let mut off_b: Vec<Vec<usize>> = vec![Vec::new(); period as usize];
    let mut z_caps = Vec::new();
    // What each column is, for repairing the dual (tau columns are 0..nph).
    let mut col_kind: Vec<Column> = (0..nph).map(Column::Tau).collect();
    for g in &spans {
        let first = ph.of(g.from);
        let len = ph.spanned(g) as usize;
        let (o, n, z) = (cols, cols + len, cols + 2 * len);
        cols += 3 * len - 1;
        for k in 0..len {
            col_kind.push(Column::Out((first as usize + k) % nph));
        }
        for k in 0..len {
            col_kind.push(Column::In((first as usize + k) % nph));
        }
        for _ in 0..len - 1 {
            col_kind.push(Column::Held(usize::MAX));
        }
        for k in 0..len {
            let phase = (first as usize + k) % nph;
            outs_in_phase[phase].push(o + k);
            ins_in_phase[phase].push(n + k);
            // z[k] - z[k-1] - o[k] + n[k] = 0, with z[-1] = z[len-1] = 0.
            let mut terms = vec![(o + k, -1.0), (n + k, 1.0)];
            if k + 1 < len {
                terms.push((z + k, 1.0));
                z_caps.push((z + k, g.bytes));
            }
            if k > 0 {
                terms.push((z + k - 1, -1.0));
            }
            eq.push(terms, 0.0);
        }
        first_outs[(g.from % period) as usize].push(o);
        for i in g.from + 1..g.to {
            let k = (ph.of(i) - first) as usize;
            let op = (i % period) as usize;
            if ph.starts_phase(i) {
                // Exactly the bytes off after the previous phase (k >= 1: the gap started in
                // an earlier phase).
                off_a[op].push(z + k - 1);
                off_b[op].push(z + k - 1);
            } else {
                if k > 0 {
                    off_a[op].push(z + k - 1);
                }
                off_a[op].push(o + k);
                if k + 1 < len {
                    off_b[op].push(z + k);
                }
                off_b[op].push(n + k);
            }
        }
    }

    let ms = |ns: u64| ns as f64 / 1e6;
    let mut phase_compute = vec![0.0; nph];
    for (i, op) in cycle.ops.iter().enumerate() {
        phase_compute[i / ph.k as usize] += ms(op.duration_ns);
    }
    // Rows (among the inequalities) that only bound one variable from below: the certificate
    // recomputes their multipliers instead of trusting the solver's.
    let mut lower_bound_rows = Vec::new();
    let mut out_row = vec![0; nph];
    let mut in_row = vec![0; nph];
    for k in 0..nph {
        let outs = outs_in_phase[k].iter().map(|&c| (c, 1.0));
        out_row[k] = ineq.rhs.len();
        ineq.push(outs.clone().chain([(k, -b_out)]), 0.0);
        let ins = ins_in_phase[k].iter().map(|&c| (c, 1.0));
        in_row[k] = ineq.rhs.len();
        ineq.push(ins.clone().chain([(k, -b_in)]), 0.0);
        ineq.push(outs.chain(ins).chain([(k, -b_both)]), 0.0);
        // tau[k] >= compute of the phase.
        lower_bound_rows.push(ineq.rhs.len());
        ineq.push([(k, -1.0)], -phase_compute[k]);
    }
    for (a, firsts) in first_outs.iter().enumerate() {
        if firsts.is_empty() {
            continue;
        }
        // Gaps opened by op a write out after it ends: within tau - d_a of their first phase.
        let k = a / ph.k as usize;
        let terms = firsts.iter().map(|&c| (c, 1.0)).chain([(k, -b_out)]);
        ineq.push(terms, -b_out * ms(cycle.ops[a].duration_ns));
    }
    for (i, &e) in excess.iter().enumerate() {
        if e == 0 {
            continue;
        }
        let e = e as f64 / MIB;
        ineq.push(off_a[i].iter().map(|&c| (c, -1.0)), -e);
        if off_b[i] != off_a[i] {
            ineq.push(off_b[i].iter().map(|&c| (c, -1.0)), -e);
        }
    }
    // Bounds: every gap variable >= 0, z <= its gap's bytes.
    for c in nph..cols {
        lower_bound_rows.push(ineq.rhs.len());
        ineq.push([(c, -1.0)], 0.0);
    }
    for &(c, cap) in &z_caps {
        col_kind[c] = Column::Held(ineq.rhs.len());
        ineq.push([(c, 1.0)], cap);
    }
    let shape = DualShape {
        col_kind,
        out_row,
        in_row,
        lower_bound_rows,
        phase_compute: phase_compute.clone(),
    };

    let (n_eq, n_ineq) = (eq.rhs.len(), ineq.rhs.len());
    let mut rows_i = eq.i;
    rows_i.extend(ineq.i.iter().map(|r| r + n_eq));
    let mut rows_j = eq.j;
    rows_j.extend(ineq.j);
    let mut vals = eq.v;
    vals.extend(ineq.v);
    let mut b = eq.rhs;
    b.extend(ineq.rhs);
    let a = CscMatrix::new_from_triplets(n_eq + n_ineq, cols, rows_i, rows_j, vals);
    let p = CscMatrix::zeros((cols, cols));
    let mut q = vec![0.0; cols];
    q[..nph].iter_mut().for_each(|x| *x = 1.0);
    let cones = [
        SupportedConeT::ZeroConeT(n_eq),
        SupportedConeT::NonnegativeConeT(n_ineq),
    ];
    let settings = DefaultSettingsBuilder::default()
        .verbose(std::env::var_os("TENSILE_LP_VERBOSE").is_some())
        .max_iter(500)
        .build()
        .ok()?;
    let mut solver = DefaultSolver::new(&p, &q, &a, &b, &cones, settings).ok()?;
    solver.solve();
    let sol = &solver.solution;
    if !matches!(
        sol.status,
        SolverStatus::Solved | SolverStatus::AlmostSolved
    ) {
        return None;
    }
    let value_ms = certified_value(&a, &b, n_eq, &sol.z, &shape)?;
    if !value_ms.is_finite() || value_ms <= 0.0 {
        return None;
    }
    Some(ScheduleBound {
        bound_ns: (value_ms * 1e6).floor() as u64,
        ops_per_phase: ph.k,
        variables: cols,
        solve_ms: started.elapsed().as_millis() as u64,
    })
}

/// What a column of the LP is, for repairing a dual vector.
#[cfg(feature = "lp")]
#[derive(Debug, Clone, Copy)]
enum Column {
    /// `tau[k]`, bounded below by the compute of phase `k`.
    Tau(usize),
    /// A write-out in phase `k` (the phase's out-engine row covers it).
    Out(usize),
    /// A read-back in phase `k` (the phase's in-engine row covers it).
    In(usize),
    /// Bytes off the device at a phase end; its cap row (`z <= bytes`).
    Held(usize),
}

/// The structure of the LP the certificate needs beyond the matrix.
#[cfg(feature = "lp")]
struct DualShape {
    col_kind: Vec<Column>,
    /// Inequality row of each phase's out-engine and in-engine capacity.
    out_row: Vec<usize>,
    in_row: Vec<usize>,
    /// Inequality rows that bound a single variable below (`tau >= compute`, `x >= 0`).
    lower_bound_rows: Vec<usize>,
    phase_compute: Vec<f64>,
}

/// A sum with a bound on its floating-point rounding error: `value - error <= exact sum`.
#[cfg(feature = "lp")]
#[derive(Default, Clone, Copy)]
struct Checked {
    value: f64,
    abs: f64,
    terms: u32,
}

#[cfg(feature = "lp")]
impl Checked {
    fn add(&mut self, x: f64) {
        self.value += x;
        self.abs += x.abs();
        self.terms += 1;
    }

    /// A number no larger than the exact sum of the (exactly represented) products added: each
    /// product and each addition rounds by at most a relative `EPSILON / 2`, so the error is
    /// below `(terms + 1) * EPSILON * sum |terms|` (a generous form of the standard bound).
    fn lower(&self) -> f64 {
        self.value - (f64::from(self.terms) + 2.0) * f64::EPSILON * self.abs
    }
}

/// A lower bound on the LP optimum from the solver's dual vector `z`, valid whatever its accuracy.
///
/// The LP is `min q'x` (q: ones on the tau columns) over `A x + s = b`, `s` zero on the first
/// `n_eq` rows and non-negative on the rest. For any `y` with `y >= 0` on the inequality rows
/// that are not single-variable lower bounds, and any feasible `x`: `q'x >= r'x - b'y` with
/// `r = q + A'y` summed over those rows only. If every `r` is non-negative, `x >= 0` on the gap
/// columns and `tau >= compute` give `q'x >= sum_k r_tau[k] compute[k] - b'y`. The solver's `z`
/// is clipped to `y >= 0`; a negative reduced cost of a write-out or read-back is lifted by
/// raising its phase's engine row (right-hand side 0: free), of a held amount by raising its cap
/// row (costs cap times the lift); a tau column left negative (the engine rows took more than its
/// unit cost) scales `y` down until none is. Every sum is a [`Checked`] one and the lower end of
/// its error interval is used, so rounding cannot raise the value. `None` if `z` is unusable.
#[cfg(feature = "lp")]
fn certified_value(
    a: &CscMatrix<f64>,
    b: &[f64],
    n_eq: usize,
    z: &[f64],
    shape: &DualShape,
) -> Option<f64> {
    let rows = b.len();
    if z.len() != rows || z.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let mut skip = vec![false; rows];
    for &r in &shape.lower_bound_rows {
        skip[n_eq + r] = true;
    }
    let mut y: Vec<f64> = z
        .iter()
        .enumerate()
        .map(|(i, &v)| if i < n_eq { v } else { v.max(0.0) })
        .collect();
    for (i, s) in skip.iter().enumerate() {
        if *s {
            y[i] = 0.0;
        }
    }
    let reduced = |y: &[f64]| -> Vec<Checked> {
        let mut r = vec![Checked::default(); a.n];
        for (c, rc) in r.iter_mut().enumerate() {
            if matches!(shape.col_kind[c], Column::Tau(_)) {
                rc.add(1.0);
            }
            for idx in a.colptr[c]..a.colptr[c + 1] {
                let row = a.rowval[idx];
                if !skip[row] {
                    rc.add(a.nzval[idx] * y[row]);
                }
            }
        }
        r
    };
    // Lift negative reduced costs of the gap columns, to a few times their rounding margin above
    // zero, so that they stay provably non-negative after the scaling below and its roundings.
    let r = reduced(&y);
    let nph = shape.out_row.len();
    let mut lift_out = vec![0.0f64; nph];
    let mut lift_in = vec![0.0f64; nph];
    for (c, rc) in r.iter().enumerate() {
        let margin = rc.value - rc.lower();
        if rc.value >= 4.0 * margin && rc.value > 0.0 {
            continue;
        }
        let deficit = 4.0 * margin - rc.value + f64::MIN_POSITIVE;
        match shape.col_kind[c] {
            Column::Tau(_) => {}
            Column::Out(k) => lift_out[k] = lift_out[k].max(deficit),
            Column::In(k) => lift_in[k] = lift_in[k].max(deficit),
            Column::Held(row) if row != usize::MAX => y[n_eq + row] += deficit,
            Column::Held(_) => return None,
        }
    }
    for k in 0..nph {
        y[n_eq + shape.out_row[k]] += lift_out[k];
        y[n_eq + shape.in_row[k]] += lift_in[k];
    }
    let r = reduced(&y);
    if r.iter()
        .enumerate()
        .any(|(c, rc)| !matches!(shape.col_kind[c], Column::Tau(_)) && rc.lower() < 0.0)
    {
        return None;
    }
    // Scale so that no tau column's reduced cost is negative: r_tau = 1 - w, w from the rows.
    let mut scale = 1.0f64;
    for (c, rc) in r.iter().enumerate() {
        if let Column::Tau(_) = shape.col_kind[c] {
            let used = 1.0 - rc.lower();
            if used > 1.0 {
                scale = scale.min(1.0 / (used * (1.0 + 1e-12)));
            }
        }
    }
    if scale < 1.0 {
        y.iter_mut().for_each(|v| *v *= scale);
    }
    let r = reduced(&y);
    let mut value = Checked::default();
    for (i, (&yi, &bi)) in y.iter().zip(b).enumerate() {
        if !skip[i] && yi != 0.0 {
            value.add(-bi * yi);
        }
    }
    for (c, rc) in r.iter().enumerate() {
        match shape.col_kind[c] {
            Column::Tau(k) => {
                let rt = rc.lower();
                if rt < 0.0 {
                    return None;
                }
                value.add(rt * shape.phase_compute[k]);
            }
            _ if rc.lower() < 0.0 => return None,
            _ => {}
        }
    }
    Some(value.lower())
}

#[cfg(feature = "lp")]
#[cfg(test)]
mod tests {
    use super::*;
    use crate::bound::lower_bound;
    use crate::cost::Budget;
    use crate::plan::plan;
    use crate::sim::{simulate, Policy, SimOptions};
    use crate::timeline::needed_bytes;

    const MIB: u64 = 1 << 20;

    use crate::cycle::persistent_tensor as persistent;

    fn solve(cycle: &Cycle, budget: u64, k: u32) -> ScheduleBound {
        let live = Liveness::of(cycle);
        let idle: u64 = live
            .idle
            .iter()
            .map(|&t| cycle.tensors[t as usize].bytes)
            .sum();
        let excess: Vec<u64> = needed_bytes(cycle, &live)
            .iter()
            .map(|&m| m.saturating_sub(budget).saturating_sub(idle))
            .collect();
        schedule_bound(cycle, &live, &excess, &CostModel::default(), k).expect("solved")
    }

    /// `min tau` with one write-out `o >= e` through an engine of rate `b`, `tau >= c`: the
    /// optimum is `max(c, e / b)`; rows as [`schedule_bound`] lays them out.
    fn one_copy_lp(e: f64, b: f64, c: f64) -> (CscMatrix<f64>, Vec<f64>, DualShape) {
        // Inequalities: 0 out engine, 1 in engine (empty), 2 tau >= c, 3 o >= 0, 4 o >= e.
        let a = CscMatrix::new_from_triplets(
            5,
            2,
            vec![0, 1, 2, 0, 3, 4],
            vec![0, 0, 0, 1, 1, 1],
            vec![-b, -b, -1.0, 1.0, -1.0, -1.0],
        );
        let rhs = vec![0.0, 0.0, -c, 0.0, -e];
        let shape = DualShape {
            col_kind: vec![Column::Tau(0), Column::Out(0)],
            out_row: vec![0],
            in_row: vec![1],
            lower_bound_rows: vec![2, 3],
            phase_compute: vec![c],
        };
        (a, rhs, shape)
    }

    #[test]
    fn the_certificate_is_exact_at_the_optimal_dual_and_never_above_the_optimum() {
        let (a, rhs, shape) = one_copy_lp(6.0, 2.0, 1.0);
        // The optimal dual: half a unit on the engine row and on the demand row.
        let exact = certified_value(&a, &rhs, 0, &[0.5, 0.0, 0.0, 0.0, 0.5], &shape).unwrap();
        assert!((exact - 3.0).abs() < 1e-9, "{exact}");
        assert!(exact <= 3.0);
        // A perturbed dual is repaired (scaled) and gives less, never more.
        let off = certified_value(&a, &rhs, 0, &[0.6, 0.1, 5.0, 7.0, 0.4], &shape).unwrap();
        assert!(off > 0.0 && off < 3.0, "{off}");
        // Garbage, deterministic: every value it certifies is at most the optimum.
        let mut x = 0x1234_5678_9ABC_DEF1u64;
        let mut certified = 0;
        for _ in 0..10_000 {
            let z: Vec<f64> = (0..5)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % 20_001) as f64 / 1000.0 - 10.0
                })
                .collect();
            if let Some(v) = certified_value(&a, &rhs, 0, &z, &shape) {
                assert!(v <= 3.0, "{z:?} certified {v}");
                certified += 1;
            }
        }
        assert!(certified > 0);
        // With compute dominating, the zero dual certifies the compute exactly.
        let (a, rhs, shape) = one_copy_lp(1.0, 2.0, 4.0);
        let compute = certified_value(&a, &rhs, 0, &[0.0; 5], &shape).unwrap();
        assert!(compute <= 4.0 && compute > 4.0 - 1e-12, "{compute}");
    }

    #[test]
    fn two_tensors_taking_turns_swap_at_the_shared_rate() {
        // Op 0 needs A, op 1 needs B, room for one: between the ops A leaves while B arrives,
        // twice per iteration. Both engines at once share 92 GB/s, so each exchange of 64 MiB
        // each way takes 128 MiB / 92 GB/s, and the 1 µs ops hide under it.
        let cycle = Cycle::from_parts(
            &[1_000, 1_000],
            vec![
                persistent(0, 64 * MIB, vec![0]),
                persistent(1, 64 * MIB, vec![1]),
            ],
        )
        .unwrap();
        let s = solve(&cycle, 64 * MIB, 1);
        let exchange_ns = (128 * MIB) as f64 / 92.0;
        let want = 2.0 * exchange_ns;
        assert!(
            (s.bound_ns as f64 - want).abs() < want * 1e-5,
            "{} against {want}",
            s.bound_ns
        );
        assert_eq!((s.ops_per_phase, s.variables), (1, 2 + 2 * (3 * 2 - 1)));
    }

    #[test]
    fn the_rotation_costs_at_least_its_bytes_and_no_plan_beats_it() {
        // Four 64 MiB tensors, one per op, room for two: the tensors off the device rotate.
        let tensors = (0..4).map(|i| persistent(i, 64 * MIB, vec![i])).collect();
        let cycle = Cycle::from_parts(&[1_000; 4], tensors).unwrap();
        let cost = CostModel::default();
        let budget = Budget::new(128 * MIB);
        let b = lower_bound(&cycle, &budget, &cost).unwrap();
        let s = b.schedule.expect("small enough to solve");
        // Every byte the covering LP must move is in this LP too, so it is never below the
        // time to move them.
        assert!(s.bound_ns as f64 >= b.packing_ns as f64 * (1.0 - 1e-5));
        assert_eq!(b.bound_ns, b.bound_ns.max(s.bound_ns));
        let p = plan(&cycle, &budget, &cost).unwrap();
        let r = simulate(
            &cycle,
            Policy::Plan(&p),
            budget,
            &cost,
            SimOptions::default(),
        )
        .unwrap();
        assert!(r.step_ns >= s.bound_ns, "{} < {}", r.step_ns, s.bound_ns);
    }

    #[test]
    fn coarser_phases_never_raise_the_bound() {
        let tensors = (0..6)
            .map(|i| persistent(i, (16 + 8 * u64::from(i)) * MIB, vec![i, (i + 3) % 6]))
            .collect();
        let cycle = Cycle::from_parts(&[2_000, 500, 1_000, 3_000, 250, 1_500], tensors).unwrap();
        let fine = solve(&cycle, 96 * MIB, 1).bound_ns;
        for k in 2..=6 {
            let coarse = solve(&cycle, 96 * MIB, k).bound_ns;
            // Relative tolerance of the solver.
            assert!(coarse <= fine + fine / 100_000, "k={k}: {coarse} > {fine}");
        }
    }

    #[test]
    fn phase_size_follows_the_variable_cap() {
        let tensors = (0..4).map(|i| persistent(i, 64 * MIB, vec![i])).collect();
        let cycle = Cycle::from_parts(&[1_000; 4], tensors).unwrap();
        let live = Liveness::of(&cycle);
        assert_eq!(ops_per_phase(&live, usize::MAX, 8), Some(1));
        assert_eq!(ops_per_phase(&live, 47, 8), Some(2));
        assert_eq!(ops_per_phase(&live, 1, 8), None);
    }
}
