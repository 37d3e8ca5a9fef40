//! Sign-in attempts are limited: a wrong token costs its address one of a few tries a
//! minute, and all addresses together get a few more, so that guessing the admin
//! token from the console is hopeless while a person who mistyped it waits seconds.
//! Pure: the caller passes the time in.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

/// Failed sign-ins one address may make per window.
pub(crate) const PER_ADDRESS: u32 = 5;
/// Failed sign-ins all addresses together may make per window.
pub(crate) const IN_ALL: u32 = 30;
/// The window.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);

/// Failures counted per address and in all, in fixed windows.
#[derive(Default)]
pub(crate) struct SignInThrottle {
    by_address: HashMap<IpAddr, Window>,
    all: Window,
}

/// Failures since `start_us`.
#[derive(Clone, Copy, Default)]
struct Window {
    start_us: u64,
    failures: u32,
}

impl Window {
    /// The window at `now_us`: a fresh one once the old has run out.
    fn at(self, now_us: u64) -> Self {
        if now_us.saturating_sub(self.start_us) >= crate::clock::micros(WINDOW) {
            Self { start_us: now_us, failures: 0 }
        } else {
            self
        }
    }

    /// How long until it runs out.
    fn left(self, now_us: u64) -> Duration {
        let end = self.start_us + crate::clock::micros(WINDOW);
        Duration::from_micros(end.saturating_sub(now_us)).max(Duration::from_secs(1))
    }
}

impl SignInThrottle {
    /// Whether `from` may try now; if not, how long to wait.
    pub(crate) fn check(&mut self, from: Option<IpAddr>, now_us: u64) -> Result<(), Duration> {
        self.all = self.all.at(now_us);
        if self.all.failures >= IN_ALL {
            return Err(self.all.left(now_us));
        }
        if let Some(addr) = from {
            if let Some(w) = self.by_address.get_mut(&addr) {
                *w = w.at(now_us);
                if w.failures >= PER_ADDRESS {
                    return Err(w.left(now_us));
                }
            }
        }
        Ok(())
    }

    /// Counts a wrong token from `from`.
    pub(crate) fn failed(&mut self, from: Option<IpAddr>, now_us: u64) {
        self.all = self.all.at(now_us);
        self.all.failures += 1;
        if let Some(addr) = from {
            // Old windows go, so that a scan of many addresses cannot grow the map
            // without bound.
            if self.by_address.len() > 10_000 {
                let window = crate::clock::micros(WINDOW);
                self.by_address.retain(|_, w| now_us.saturating_sub(w.start_us) < window);
            }
            let w = self.by_address.entry(addr).or_default();
            *w = w.at(now_us);
            w.failures += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn addr(n: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, n]))
    }

    #[test]
    fn an_address_gets_a_few_tries_a_minute() {
        let mut t = SignInThrottle::default();
        for i in 0..PER_ADDRESS {
            assert!(t.check(addr(1), i as u64 * S).is_ok());
            t.failed(addr(1), i as u64 * S);
        }
        let wait = t.check(addr(1), 10 * S).unwrap_err();
        assert_eq!(wait, Duration::from_secs(50));
        assert!(t.check(addr(2), 10 * S).is_ok(), "another address is not held back");
        assert!(t.check(addr(1), 60 * S).is_ok(), "the next window starts afresh");
    }

    #[test]
    fn all_addresses_together_are_limited_too() {
        let mut t = SignInThrottle::default();
        for i in 0..IN_ALL {
            let from = addr((i % 250) as u8);
            assert!(t.check(from, S).is_ok(), "{i}");
            t.failed(from, S);
        }
        assert!(t.check(addr(251), 2 * S).is_err());
        assert!(t.check(None, 2 * S).is_err());
        assert!(t.check(addr(251), 61 * S).is_ok());
    }

    #[test]
    fn the_wait_is_at_least_a_second() {
        let mut t = SignInThrottle::default();
        for _ in 0..PER_ADDRESS {
            t.failed(addr(1), 0);
        }
        assert_eq!(t.check(addr(1), 60 * S - 1).unwrap_err(), Duration::from_secs(1));
    }
}
