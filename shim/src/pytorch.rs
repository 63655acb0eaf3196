//! PyTorch's allocator choice (`PYTORCH_CUDA_ALLOC_CONF`).
//!
//! PyTorch's default caching allocator asks the driver for large segments and carves tensors
//! out of them itself, so the shim would only see segments. Its `cudaMallocAsync` backend
//! makes one stream-ordered driver allocation per tensor, which the memory manager can then
//! swap one by one. The library constructor therefore selects that backend when the variable
//! is unset, and warns (once) when the user chose another one. This module only decides; the
//! constructor ([`crate::runtime::on_load`]) sets the variable.

/// The value set when the variable is unset.
pub const ASYNC_BACKEND_CONF: &str = "backend:cudaMallocAsync";

/// What to do about `PYTORCH_CUDA_ALLOC_CONF`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocConf {
    /// Unset (or empty): set it to [`ASYNC_BACKEND_CONF`].
    Set,
    /// Already selects `cudaMallocAsync`: nothing to do.
    Keep,
    /// Another allocator is in use (the named backend; `native` when none is named).
    Other(String),
}

/// Decides from the current value of the variable.
pub fn decide(current: Option<&str>) -> AllocConf {
    let Some(value) = current.filter(|v| !v.trim().is_empty()) else {
        return AllocConf::Set;
    };
    // The format is `key:value` pairs separated by commas; the last `backend` wins.
    let backend = value
        .split(',')
        .rev()
        .filter_map(|pair| pair.split_once(':'))
        .filter(|(k, _)| k.trim() == "backend")
        .map(|(_, v)| v.trim())
        .next();
    match backend {
        Some("cudaMallocAsync") => AllocConf::Keep,
        Some(other) => AllocConf::Other(other.to_owned()),
        None => AllocConf::Other("native".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_empty_is_set() {
        assert_eq!(decide(None), AllocConf::Set);
        assert_eq!(decide(Some("  ")), AllocConf::Set);
    }

    #[test]
    fn the_async_backend_is_kept_and_others_are_reported() {
        assert_eq!(decide(Some("backend:cudaMallocAsync")), AllocConf::Keep);
        assert_eq!(
            decide(Some("max_split_size_mb:128, backend: cudaMallocAsync")),
            AllocConf::Keep
        );
        assert_eq!(
            decide(Some("backend:native")),
            AllocConf::Other("native".into())
        );
        assert_eq!(
            decide(Some("expandable_segments:True")),
            AllocConf::Other("native".into())
        );
        assert_eq!(
            decide(Some("backend:cudaMallocAsync,backend:native")),
            AllocConf::Other("native".into())
        );
    }
}
