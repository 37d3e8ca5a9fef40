//! Retry delays: exponential with full jitter, the exponential ceiling computed by
//! `backon` (its own jitter adds `[0, d)` on top of `d`, which is not full jitter).
//! The random draw is a parameter, so the delay is a pure function of its inputs.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

use crate::config::RetryPolicy;

/// The delay ceiling after `failures` failed attempts (1 = after the first failure):
/// `initial × multiplier^(failures-1)`, capped at `max_backoff`.
pub(crate) fn ceiling(policy: &RetryPolicy, failures: u32) -> Duration {
    let n = usize::try_from(failures.max(1) - 1).unwrap_or(usize::MAX);
    ExponentialBuilder::default()
        .with_min_delay(policy.initial_backoff)
        .with_factor(policy.backoff_multiplier)
        .with_max_delay(policy.max_backoff)
        .without_max_times()
        .build()
        .nth(n)
        .unwrap_or(policy.max_backoff)
}

/// The delay before the next attempt: `(1 - jitter) × ceiling` with `jitter` drawn
/// uniformly from `[0, 1)` ("full jitter", which spreads a burst of failures instead
/// of retrying it in lockstep), at least 1 ms, but never earlier than a `Retry-After`
/// the destination asked for, itself capped at `max_backoff`.
pub(crate) fn next_delay(
    policy: &RetryPolicy,
    failures: u32,
    retry_after: Option<Duration>,
    jitter: f64,
) -> Duration {
    let ceiling = ceiling(policy, failures);
    let jittered = ceiling.mul_f64((1.0 - jitter).clamp(0.0, 1.0)).max(Duration::from_millis(1));
    match retry_after {
        Some(asked) => jittered.max(asked.min(policy.max_backoff)),
        None => jittered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            initial_backoff: Duration::from_secs(1),
            backoff_multiplier: 2.0,
            max_backoff: Duration::from_secs(600),
            ..RetryPolicy::default()
        }
    }

    #[test]
    fn ceilings_double_up_to_the_cap() {
        let p = policy();
        let got: Vec<u64> = (1..=12).map(|n| ceiling(&p, n).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600]);
        assert_eq!(ceiling(&p, 50), Duration::from_secs(600));
    }

    #[test]
    fn delays_are_jittered_below_the_ceiling() {
        let p = policy();
        let delays: Vec<Duration> =
            (0..200).map(|_| next_delay(&p, 4, None, fastrand::f64())).collect();
        assert!(delays.iter().all(|d| *d > Duration::ZERO && *d <= Duration::from_secs(8)));
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 100, "jitter spreads the delays");
        assert!(delays.iter().any(|d| *d < Duration::from_secs(2)), "full jitter reaches low");
        assert_eq!(next_delay(&p, 4, None, 0.0), Duration::from_secs(8));
        assert_eq!(next_delay(&p, 4, None, 1.0), Duration::from_millis(1));
    }

    #[test]
    fn retry_after_is_a_floor_capped_at_max_backoff() {
        let p = policy();
        assert!(next_delay(&p, 1, Some(Duration::from_secs(30)), 0.5) >= Duration::from_secs(30));
        assert_eq!(
            next_delay(&p, 1, Some(Duration::from_secs(7200)), 0.5),
            Duration::from_secs(600)
        );
    }
}
