//! PyTorch's allocator choice (`PYTORCH_ALLOC_CONF`, and the deprecated
//! `PYTORCH_CUDA_ALLOC_CONF`).
//!
//! PyTorch's default caching allocator asks the driver for large segments and carves tensors
//! out of them itself, so the shim would only see segments. Its `cudaMallocAsync` backend
//! makes one stream-ordered driver allocation per tensor, which the memory manager can then
//! swap one by one. The library constructor therefore selects that backend unless the user
//! chose one, and warns (once) when the user chose another one.
//!
//! [`plan`] is the decision, a pure function of the two variables' values (so it is tested
//! without touching the process environment); [`configure_allocator`] reads the environment,
//! applies the plan and logs. This module is not the constructor: that is
//! [`crate::runtime::on_load`], which decides whether to call it at all (not with
//! `TENSILE_POLICY=off`).
//!
//! # Which variable PyTorch reads
//! From PyTorch's c10 sources (`c10/cuda/CUDAAllocatorConfig.h`,
//! `CUDAAllocatorConfig::instance()`, whose `use_async_allocator()` picks the backend at load
//! time in `c10/cuda/CUDACachingAllocator.cpp`, and `c10/core/AllocatorConfig.cpp`,
//! `AcceleratorAllocatorConfig::instance()`, for the device-independent options), PyTorch
//! 2.9 and later:
//! - read `PYTORCH_ALLOC_CONF` whenever it is *set*, even to an empty string (`c10::utils::
//!   get_env` returns a value for an empty variable), and then ignore
//!   `PYTORCH_CUDA_ALLOC_CONF` entirely;
//! - read `PYTORCH_CUDA_ALLOC_CONF` only when `PYTORCH_ALLOC_CONF` is unset, and then warn
//!   once that it is deprecated (`TORCH_WARN_ONCE`). Setting both gives no warning.
//!
//! PyTorch before 2.9 reads only `PYTORCH_CUDA_ALLOC_CONF`. So when the user set neither,
//! both are set to the same value: every version selects the backend and none warns.

/// The value set when the user set neither variable.
pub const ASYNC_BACKEND_CONF: &str = "backend:cudaMallocAsync";

/// The backend name PyTorch's CUDA allocator configuration accepts for the stream-ordered
/// allocator (the other accepted name is `native`).
const ASYNC_BACKEND: &str = "cudaMallocAsync";

/// One of PyTorch's two allocator configuration variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfVar {
    /// `PYTORCH_ALLOC_CONF` (PyTorch 2.9+; wins when set).
    Generic,
    /// `PYTORCH_CUDA_ALLOC_CONF` (deprecated since 2.9, the only one before).
    Cuda,
}

impl ConfVar {
    pub fn name(self) -> &'static str {
        match self {
            ConfVar::Generic => "PYTORCH_ALLOC_CONF",
            ConfVar::Cuda => "PYTORCH_CUDA_ALLOC_CONF",
        }
    }
}

/// A change to the process environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvChange {
    Set(ConfVar, String),
    Unset(ConfVar),
}

/// What the constructor does about PyTorch's allocator configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AllocConfPlan {
    /// Environment changes, in order.
    pub changes: Vec<EnvChange>,
    /// The user chose another backend, in this variable: warn once, change nothing.
    pub other_backend: Option<(ConfVar, String)>,
}

/// The backend a configuration value names, if any. The format is `key:value` pairs
/// separated by commas (PyTorch ignores spaces); PyTorch parses the pairs in order, so the
/// last `backend` wins.
fn named_backend(value: &str) -> Option<&str> {
    value
        .split(',')
        .rev()
        .filter_map(|pair| pair.split_once(':'))
        .filter(|(k, _)| k.trim() == "backend")
        .map(|(_, v)| v.trim())
        .next()
}

fn non_blank(v: Option<&str>) -> Option<&str> {
    v.filter(|v| !v.trim().is_empty())
}

/// Decides from the values of `PYTORCH_ALLOC_CONF` (`generic`) and `PYTORCH_CUDA_ALLOC_CONF`
/// (`cuda`), `None` for an unset variable:
/// - neither set (or both blank): set both to [`ASYNC_BACKEND_CONF`];
/// - a variable names a backend other than `cudaMallocAsync` (the one PyTorch reads first
///   is reported): the user chose; change nothing, warn;
/// - otherwise every set variable that names no backend gets `backend:cudaMallocAsync`
///   appended to its options; the other variable is not created. A blank
///   `PYTORCH_ALLOC_CONF` beside a non-blank `PYTORCH_CUDA_ALLOC_CONF` is removed, because
///   PyTorch 2.9+ would read the empty one and never see the user's options.
pub fn plan(generic: Option<&str>, cuda: Option<&str>) -> AllocConfPlan {
    let (g, c) = (non_blank(generic), non_blank(cuda));
    let mut out = AllocConfPlan::default();
    if g.is_none() && c.is_none() {
        for var in [ConfVar::Generic, ConfVar::Cuda] {
            out.changes
                .push(EnvChange::Set(var, ASYNC_BACKEND_CONF.to_owned()));
        }
        return out;
    }
    // In PyTorch's reading order.
    let set = [(ConfVar::Generic, g), (ConfVar::Cuda, c)];
    let other = set.iter().find_map(|&(var, v)| {
        let b = named_backend(v?)?;
        (b != ASYNC_BACKEND).then(|| (var, b.to_owned()))
    });
    if other.is_some() {
        out.other_backend = other;
        return out;
    }
    if generic.is_some() && g.is_none() {
        out.changes.push(EnvChange::Unset(ConfVar::Generic));
    }
    for (var, v) in set {
        if let Some(v) = v.filter(|v| named_backend(v).is_none()) {
            let options = v.trim_end().trim_end_matches(',');
            out.changes.push(EnvChange::Set(
                var,
                format!("{options},{ASYNC_BACKEND_CONF}"),
            ));
        }
    }
    out
}

/// Reads both variables, applies [`plan`] and logs what it did (info) or the user's other
/// backend (one warning). Must run while the process is single-threaded (the library
/// constructor): `setenv` races with any concurrent reader of the environment.
pub fn configure_allocator() {
    // A value that is not UTF-8 is not something PyTorch's parser accepts either; it is
    // read lossily so that its backend (if any) is still respected.
    let read =
        |var: ConfVar| std::env::var_os(var.name()).map(|v| v.to_string_lossy().into_owned());
    let (generic, cuda) = (read(ConfVar::Generic), read(ConfVar::Cuda));
    let plan = plan(generic.as_deref(), cuda.as_deref());
    if let Some((var, backend)) = &plan.other_backend {
        tracing::warn!(
            "tensile: {} selects the {backend} allocator; tensor-level memory management is \
             limited to its segments (remove the backend, or use backend:cudaMallocAsync)",
            var.name()
        );
    }
    for change in &plan.changes {
        apply(change);
    }
}

fn apply(change: &EnvChange) {
    let (var, value) = match change {
        EnvChange::Set(var, value) => (*var, Some(value.as_str())),
        EnvChange::Unset(var) => (*var, None),
    };
    let Ok(name) = std::ffi::CString::new(var.name()) else {
        return;
    };
    let r = match value {
        Some(value) => {
            let Ok(cvalue) = std::ffi::CString::new(value) else {
                return;
            };
            // SAFETY: two valid C strings; called from the library constructor, before any
            // other thread of the process exists that could read the environment.
            unsafe { libc::setenv(name.as_ptr(), cvalue.as_ptr(), 1) }
        }
        // SAFETY: as above, one valid C string, single-threaded.
        None => unsafe { libc::unsetenv(name.as_ptr()) },
    };
    if r != 0 {
        tracing::warn!("tensile: could not change {}", var.name());
    } else if let Some(value) = value {
        tracing::info!(
            "tensile: set {}={value} (one allocation per tensor)",
            var.name()
        );
    } else {
        tracing::info!(
            "tensile: removed the empty {} (PyTorch would read it instead of {})",
            var.name(),
            ConfVar::Cuda.name()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ConfVar::{Cuda, Generic};

    fn set(var: ConfVar, v: &str) -> EnvChange {
        EnvChange::Set(var, v.to_owned())
    }

    #[test]
    fn neither_set_sets_both_to_the_async_backend() {
        let both = vec![
            set(Generic, ASYNC_BACKEND_CONF),
            set(Cuda, ASYNC_BACKEND_CONF),
        ];
        for (g, c) in [
            (None, None),
            (Some(""), None),
            (None, Some("  ")),
            (Some(" "), Some("")),
        ] {
            let p = plan(g, c);
            assert_eq!(p.changes, both, "{g:?} {c:?}");
            assert_eq!(p.other_backend, None);
        }
    }

    #[test]
    fn a_named_async_backend_is_kept_as_it_is() {
        for (g, c) in [
            (Some("backend:cudaMallocAsync"), None),
            (None, Some("backend:cudaMallocAsync")),
            (
                Some("backend: cudaMallocAsync"),
                Some("backend:cudaMallocAsync"),
            ),
        ] {
            assert_eq!(plan(g, c), AllocConfPlan::default(), "{g:?} {c:?}");
        }
    }

    #[test]
    fn another_backend_in_either_variable_is_respected_and_reported() {
        let p = plan(Some("backend:native"), None);
        assert_eq!(p.changes, vec![]);
        assert_eq!(p.other_backend, Some((Generic, "native".into())));

        let p = plan(None, Some("expandable_segments:True,backend:native"));
        assert_eq!(p.changes, vec![]);
        assert_eq!(p.other_backend, Some((Cuda, "native".into())));

        // The last `backend` of a value wins, as in PyTorch's parser.
        let p = plan(Some("backend:cudaMallocAsync,backend:native"), None);
        assert_eq!(p.other_backend, Some((Generic, "native".into())));

        // The variable PyTorch 2.9 reads is reported first; nothing is appended to the other.
        let p = plan(Some("backend:native"), Some("max_split_size_mb:128"));
        assert_eq!(p.changes, vec![]);
        assert_eq!(p.other_backend, Some((Generic, "native".into())));

        // A native choice in the deprecated variable is still the user's (older PyTorch reads
        // only that one): the options without a backend in the new one stay untouched.
        let p = plan(Some("expandable_segments:True"), Some("backend:native"));
        assert_eq!(p.changes, vec![]);
        assert_eq!(p.other_backend, Some((Cuda, "native".into())));
    }

    #[test]
    fn options_without_a_backend_get_it_appended_in_their_own_variable() {
        let p = plan(Some("expandable_segments:True"), None);
        assert_eq!(
            p.changes,
            vec![set(
                Generic,
                "expandable_segments:True,backend:cudaMallocAsync"
            )]
        );
        assert_eq!(p.other_backend, None);

        let p = plan(
            None,
            Some("max_split_size_mb:128, garbage_collection_threshold:0.6,"),
        );
        assert_eq!(
            p.changes,
            vec![set(
                Cuda,
                "max_split_size_mb:128, garbage_collection_threshold:0.6,backend:cudaMallocAsync"
            )]
        );

        // Both set, one with the backend: only the other one changes.
        let p = plan(
            Some("backend:cudaMallocAsync"),
            Some("expandable_segments:True"),
        );
        assert_eq!(
            p.changes,
            vec![set(
                Cuda,
                "expandable_segments:True,backend:cudaMallocAsync"
            )]
        );

        // Both without a backend: each keeps its own options.
        let p = plan(
            Some("pinned_num_register_threads:8"),
            Some("expandable_segments:True"),
        );
        assert_eq!(
            p.changes,
            vec![
                set(
                    Generic,
                    "pinned_num_register_threads:8,backend:cudaMallocAsync"
                ),
                set(Cuda, "expandable_segments:True,backend:cudaMallocAsync"),
            ]
        );
    }

    #[test]
    fn an_empty_new_variable_that_would_hide_the_old_one_is_removed() {
        let p = plan(Some(""), Some("expandable_segments:True"));
        assert_eq!(
            p.changes,
            vec![
                EnvChange::Unset(Generic),
                set(Cuda, "expandable_segments:True,backend:cudaMallocAsync"),
            ]
        );
        // An empty old variable beside a non-empty new one is harmless: PyTorch 2.9 never
        // reads it, older versions never read the new one. Left alone.
        let p = plan(Some("expandable_segments:True"), Some(""));
        assert_eq!(
            p.changes,
            vec![set(
                Generic,
                "expandable_segments:True,backend:cudaMallocAsync"
            )]
        );
    }
}
