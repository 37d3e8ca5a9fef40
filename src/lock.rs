//! Locking a mutex of plain data, and the value in force of what a reload replaces.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, recovering the data if a thread panicked while holding it: every mutex
/// here guards plain data that is consistent between statements, so a panic elsewhere
/// must not take the rest of the relay down with it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The value in force of something a reload replaces whole (the destinations, the
/// dispatch plan, the admin tokens, the sources): readers take the value as it is at
/// that moment and keep it for the work they began with it (an attempt finishes under
/// the destination it started with); a reload puts the next one in at once.
pub(crate) struct Current<T>(std::sync::RwLock<std::sync::Arc<T>>);

impl<T> Current<T> {
    pub(crate) fn new(value: impl Into<std::sync::Arc<T>>) -> Self {
        Self(std::sync::RwLock::new(value.into()))
    }

    /// The value in force now.
    pub(crate) fn load(&self) -> std::sync::Arc<T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Puts `value` in force; returns the one it replaces.
    pub(crate) fn replace(&self, value: impl Into<std::sync::Arc<T>>) -> std::sync::Arc<T> {
        let mut current = self.0.write().unwrap_or_else(PoisonError::into_inner);
        std::mem::replace(&mut *current, value.into())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Current;

    #[test]
    fn a_value_taken_stays_whole_while_the_next_is_put_in_force() {
        let current: Current<Vec<i32>> = Current::new(vec![1, 2]);
        let taken = current.load();
        let old = current.replace(Arc::new(vec![3]));
        assert_eq!(*taken, vec![1, 2]);
        assert_eq!(*old, vec![1, 2]);
        assert_eq!(*current.load(), vec![3]);
    }
}
