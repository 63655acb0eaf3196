//! Random synthetic cycles shared by the property tests.

#![allow(dead_code)]

use proptest::prelude::*;
use tensile_analyzer::cycle::{Cycle, Identity, Tensor};

/// Describes one tensor before it is placed in a cycle.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub mib: u64,
    pub persistent: bool,
    pub start: usize,
    pub len_frac: f64,
    pub access_fracs: Vec<f64>,
}

pub fn tensor_spec() -> impl Strategy<Value = TensorSpec> {
    tensor_spec_of(1..64, 0.3)
}

/// [`tensor_spec`] with sizes in `mib` and persistent with probability `persistent`.
pub fn tensor_spec_of(
    mib: std::ops::Range<u64>,
    persistent: f64,
) -> impl Strategy<Value = TensorSpec> {
    (
        mib,
        prop::bool::weighted(persistent),
        0usize..1000,
        0.05f64..0.95,
        prop::collection::vec(0.0f64..1.0, 0..5),
    )
        .prop_map(
            |(mib, persistent, start, len_frac, access_fracs)| TensorSpec {
                mib,
                persistent,
                start,
                len_frac,
                access_fracs,
            },
        )
}

/// Builds a cycle of `durations.len()` ops from the specs.
pub fn build(durations: &[u64], specs: &[TensorSpec]) -> Cycle {
    let p = durations.len();
    let mut tensors = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        let bytes = s.mib << 20;
        if s.persistent {
            let mut acc: Vec<u32> = s
                .access_fracs
                .iter()
                .map(|f| ((f * p as f64) as usize).min(p - 1) as u32)
                .collect();
            acc.sort_unstable();
            acc.dedup();
            tensors.push(Tensor {
                identity: Identity::Persistent {
                    trace_id: i as u64 + 1,
                },
                bytes,
                accesses: acc,
                alloc_at: None,
                free_at: None,
                source: i as u32,
            });
        } else {
            let alloc = s.start % p;
            let len = ((s.len_frac * p as f64) as usize).clamp(1, p - 1);
            let mut offs: Vec<usize> = s
                .access_fracs
                .iter()
                .map(|f| ((f * len as f64) as usize).min(len - 1))
                .collect();
            if offs.is_empty() {
                offs.push(0);
            }
            offs.sort_unstable();
            offs.dedup();
            let accesses = offs.iter().map(|o| ((alloc + o) % p) as u32).collect();
            tensors.push(Tensor {
                identity: Identity::Transient {
                    ordinal: i as u32,
                    bytes,
                },
                bytes,
                accesses,
                alloc_at: Some(alloc as u32),
                free_at: Some(((alloc + len) % p) as u32),
                source: i as u32,
            });
        }
    }
    Cycle::from_parts(durations, tensors).expect("valid synthetic cycle")
}

pub fn cycle_strategy() -> impl Strategy<Value = Cycle> {
    (
        prop::collection::vec(1_000u64..2_000_000, 4..60),
        prop::collection::vec(tensor_spec(), 1..40),
    )
        .prop_map(|(durations, specs)| build(&durations, &specs))
}

/// Cycles of tensors of a few 2 MiB pages, mostly transients, with some ops long enough for
/// a host running ahead to get iterations ahead of the compute stream: where LRU in shim
/// pages allocates ahead of frees and cancels swap-outs (lifetimes that wrap, many of them).
pub fn paged_cycle_strategy() -> impl Strategy<Value = Cycle> {
    (
        prop::collection::vec(prop_oneof![Just(1_000u64), 1_000u64..3_000_000], 4..120),
        prop::collection::vec(tensor_spec_of(1..24, 0.2), 1..20),
    )
        .prop_map(|(durations, specs)| build(&durations, &specs))
}

/// Copy-bound cycles: short ops (1-50 µs) and persistent tensors of 1-64 MiB, each touched at
/// one to three points, so that at a low budget the data on the host must rotate.
pub fn copy_bound_cycle_strategy() -> impl Strategy<Value = Cycle> {
    (
        prop::collection::vec(1_000u64..50_000, 3..40),
        prop::collection::vec((1u64..64, prop::collection::vec(0.0f64..1.0, 1..4)), 2..16),
    )
        .prop_map(|(durations, tensors)| {
            let specs: Vec<TensorSpec> = tensors
                .into_iter()
                .map(|(mib, access_fracs)| TensorSpec {
                    mib,
                    persistent: true,
                    start: 0,
                    len_frac: 0.5,
                    access_fracs,
                })
                .collect();
            build(&durations, &specs)
        })
}
