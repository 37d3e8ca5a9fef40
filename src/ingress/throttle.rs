//! Log lines that anyone on the internet can cause (a wrong token) are throttled: the
//! first of each kind per window is logged, the rest are counted and reported with the
//! next logged one. The metrics still count every request.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::lock::lock;

/// How long one logged line stands for its kind.
pub(super) const WINDOW: Duration = Duration::from_secs(60);

/// Per kind (a bounded label: a configured source, or `unknown`): when its window
/// began and how many lines it has held back since.
#[derive(Default)]
pub(super) struct Throttle {
    kinds: Mutex<HashMap<String, (Instant, u64)>>,
}

impl Throttle {
    /// Whether to log this occurrence of `kind` at `now`, and if so how many were held
    /// back since the last logged one.
    pub(super) fn admit(&self, kind: &str, now: Instant) -> Option<u64> {
        let mut kinds = lock(&self.kinds);
        match kinds.get_mut(kind) {
            Some((since, held)) if now.saturating_duration_since(*since) < WINDOW => {
                *held += 1;
                None
            }
            Some((since, held)) => {
                let suppressed = *held;
                *since = now;
                *held = 0;
                Some(suppressed)
            }
            None => {
                kinds.insert(kind.to_owned(), (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_kind_per_window_with_the_count_held_back() {
        let t = Throttle::default();
        let t0 = Instant::now();
        assert_eq!(t.admit("demo", t0), Some(0));
        for i in 1..=500 {
            assert_eq!(t.admit("demo", t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(t.admit("unknown", t0), Some(0), "kinds are throttled apart");
        assert_eq!(t.admit("demo", t0 + WINDOW), Some(500));
        assert_eq!(t.admit("demo", t0 + WINDOW + Duration::from_secs(1)), None);
    }
}
