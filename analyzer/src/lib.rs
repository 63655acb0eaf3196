//! `tensile-analyzer`: learns the training iteration from a trace, plans swaps for a memory
//! budget, bounds what any plan can achieve, and simulates policies. Pure Rust, no CUDA.
//!
//! The pipeline, one module per step:
//! 1. [`import`]: read a trace file (capture v1 or the project's own format) into a [`Trace`].
//! 2. [`iteration`]: find the repeating unit (one training step) and where each instance starts.
//! 3. [`cycle`]: turn one instance into a periodic [`Cycle`]: ops with durations, and tensors
//!    with stable identities and access lists.
//! 4. [`timeline`]: per-tensor timelines and the memory footprint curve.
//! 5. [`plan`]: a periodic swap plan for a budget ([`plan::plan`]), and [`bound`]: the lower
//!    bound on step time for that budget; [`search`]: a local search that improves a plan
//!    with the simulator as judge.
//! 6. [`sim`]: replays a cycle under a policy and checks the budget and residency invariants.
//! 7. [`exec_plan`]: restates a plan in the shim's terms (launch positions, allocation roles),
//!    [`restore`]: the other way, a run's plan back on a cycle for the simulator, and
//!    [`online`]: the learner that runs steps 2 to 7 on a live stream of trace records.
//!
//! Not here: anything that touches a GPU or the driver (that is the shim's job).

pub mod bound;
pub mod cost;
pub mod cycle;
pub mod evaluate;
pub mod exec_plan;
pub mod import;
pub mod iteration;
pub mod model;
pub mod online;
pub mod pieces;
pub mod plan;
pub mod restore;
pub mod schedule_bound;
pub mod search;
pub mod sim;
pub mod timeline;

pub use bound::BoundOptions;
pub use cost::{
    Budget, CostModel, PageRemapCost, RemapModel, SwappedMapping, VmmCallCosts,
    SHIM_MAX_UNIT_PAGES, SHIM_PLAN_UNIT_PAGES,
};
pub use cycle::Cycle;
pub use evaluate::{
    analyze, evaluate, evaluate_many, evaluate_many_with, Analysis, Evaluation, PolicyKind,
};
pub use model::Trace;
