//! Helpers shared by the end-to-end tests (being written).
