//! Handle tables: how an opaque driver handle (`CUstream`, `CUevent`, ...) is told valid.
//!
//! A handle is the address of the object it names, so handles of different kinds never
//! collide while alive, and a stale or foreign handle is simply absent from the table
//! (`CUDA_ERROR_INVALID_HANDLE` or similar) instead of being dereferenced.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Debug)]
pub struct Registry<T> {
    map: Mutex<HashMap<usize, Arc<T>>>,
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> Registry<T> {
    /// The handle value of `obj`.
    pub fn handle_of(obj: &Arc<T>) -> usize {
        Arc::as_ptr(obj) as *const u8 as usize
    }

    /// Registers `obj`; returns its handle.
    pub fn insert(&self, obj: Arc<T>) -> usize {
        let h = Self::handle_of(&obj);
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(h, obj);
        h
    }

    pub fn get(&self, handle: usize) -> Option<Arc<T>> {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&handle)
            .cloned()
    }

    pub fn remove(&self, handle: usize) -> Option<Arc<T>> {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&handle)
    }
}
