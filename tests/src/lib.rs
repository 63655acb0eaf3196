//! End-to-end tests of libtensile on the simulated GPU: the workloads (`src/bin/`), the
//! machinery they share, and the harness the tests in `tests/` use.
//!
//! | module | what |
//! | --- | --- |
//! | [`driver`] | how a workload finds the driver's entry points (the ways real programs do) |
//! | [`session`] | a workload's driver calls, each printing what the trace must show |
//! | [`expect`] | the line protocol between workloads and tests |
//! | [`harness`] | building libtensile.so and the simulated GPU, running workloads |
//! | [`rng`] | a seeded sequence for workloads that draw sizes and timings |
//! | [`check`] | reading a trace back and comparing it with the expectations |

pub mod check;
pub mod driver;
pub mod expect;
pub mod harness;
pub mod rng;
pub mod session;
