//! `tensile-protocol`: what the shim inside a job and the planner outside it (the coordinator,
//! or the in-process planner of `TENSILE_COORDINATOR=off`) exchange.
//!
//! It depends on nothing that knows CUDA or plans: `libtensile.so` links it without the
//! planner's solver, and the coordinator links it without the shim, as both link `trace/` for
//! the trace format.
//!
//! - [`plan`]: the executable plan, in the terms the shim sees at run time (launch positions in
//!   the iteration, allocations named by role), and its encoding.
//! - [`segment`]: the shared-memory segment of one GPU and user (layout, name, checks).
//! - [`slot`]: a job's row in it, and how a slot is claimed and reclaimed.
//! - [`ring`]: a job's event ring (the job writes records, the coordinator reads them).
//! - [`command`]: a job's command area (the coordinator writes plans and budgets).
//! - [`job`] ([`JobClient`]) and [`coordinator`] ([`CoordinatorSegment`]): the two sides;
//!   [`view`] ([`SegmentView`]): a read-only look for `tensile status`.
//! - [`process`]: process identity (pid and start time) and the heartbeat clock; [`shm`]:
//!   the POSIX shared-memory calls.

pub mod command;
pub mod coordinator;
pub mod job;
pub mod plan;
pub mod process;
pub mod ring;
pub mod segment;
pub mod shm;
pub mod slot;
pub mod view;

pub use command::{Command, CommandError, CommandRead};
pub use coordinator::{CoordinatorSegment, Delivery, Reclaimed};
pub use job::{JobClient, JobOptions};
pub use plan::{Action, ExecPlan, Iteration, PieceRef, PlanDecodeError, Role, Step, Use, When};
pub use process::ProcessIdentity;
pub use ring::Corruption;
pub use segment::{Geometry, SegmentError, LAYOUT_VERSION};
pub use slot::{
    Admission, JobSnapshot, PlanState, Priority, SlotRoom, StepCounters, DEFAULT_PAGE_BYTES,
    MAX_ROOM_PERMILLE,
};
pub use view::{CoordinatorInfo, SegmentView};
