//! [`lock`]: the one way evlet takes a `std::sync::Mutex`.
//!
//! A panic while a lock is held poisons it; evlet's locks guard plain data
//! whose every update is complete before the guard drops, so the data is
//! still consistent and the agent's loops keep going instead of panicking in
//! turn (no panic can kill the daemon's loops).

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
