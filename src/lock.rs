//! Locking a mutex of plain data.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, recovering the data if a thread panicked while holding it: every mutex
/// here guards plain data that is consistent between statements, so a panic elsewhere
/// must not take the rest of the relay down with it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
