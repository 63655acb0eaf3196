//! `tensile-protocol`: what the shim inside a job and the planner outside it (the coordinator,
//! or the in-process planner of `TENSILE_COORDINATOR=off`) exchange.
//!
//! It depends on nothing that knows CUDA or plans: `libtensile.so` links it without the
//! planner's solver, and the coordinator links it without the shim, as both link `trace/` for
//! the trace format.
//!
//! - [`plan`]: the executable plan, in the terms the shim sees at run time (launch positions in
//!   the iteration, allocations named by role), and its encoding.

pub mod plan;

pub use plan::{Action, ExecPlan, Iteration, PieceRef, PlanDecodeError, Role, Step, When};
