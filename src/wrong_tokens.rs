//! Wrong tokens are limited per client: a wrong token, at the console's sign-in, as a
//! bearer token on `/admin` or on a pull destination's routes (`pull/`), costs its
//! client one of a few tries a minute, whichever token it tried;
//! past them the client is refused unread until the window ends. Only that client:
//! a flood of wrong tokens from one address never locks out the right token from
//! another (a limit over all clients did, and so let anyone lock every operator out).
//! A client is an IPv4 address, or an IPv6 /64 (one host's worth of addresses). With
//! admin tokens of at least 16 bytes, guessing stays hopeless however many addresses
//! take part. Pure: the caller passes the time in.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

/// Wrong tokens one client may give per window, unless `admin.wrong_tokens_per_minute`
/// says otherwise.
pub(crate) const PER_ADDRESS: u32 = 5;
/// The window.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);
/// The window in microseconds, the unit of the times passed in.
const WINDOW_US: u64 = WINDOW.as_micros() as u64;
/// Clients tracked at most: past it, windows that ran out go first, then the map
/// starts again (a scan from that many addresses gains little: see the module doc).
const TRACKED: usize = 100_000;

/// Why a presented token was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Its client gave too many wrong tokens lately: refused unread, for this long.
    Throttled(Duration),
    /// The token is wrong (counted against its client).
    Wrong,
}

/// Failures counted per client, in fixed windows.
pub(crate) struct WrongTokens {
    by_address: HashMap<IpAddr, Window>,
    /// Wrong tokens a client may give per window.
    limit: u32,
}

impl Default for WrongTokens {
    fn default() -> Self {
        Self::new(PER_ADDRESS)
    }
}

impl WrongTokens {
    /// Lets each client give `limit` wrong tokens a window from now on (a reload);
    /// what each has given so far still counts.
    pub(crate) fn set_limit(&mut self, limit: u32) {
        self.limit = limit.max(1);
    }

    /// A throttle letting each client give `limit` wrong tokens a window (at least 1).
    pub(crate) fn new(limit: u32) -> Self {
        Self { by_address: HashMap::new(), limit: limit.max(1) }
    }
}

/// The client an address belongs to: itself (IPv4, or an IPv4-mapped IPv6), or its
/// IPv6 /64.
fn client(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(_) => addr,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut octets = v6.octets();
                octets[8..].fill(0);
                IpAddr::from(octets)
            }
        },
    }
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
        if now_us.saturating_sub(self.start_us) >= WINDOW_US {
            Self { start_us: now_us, failures: 0 }
        } else {
            self
        }
    }

    /// How long until it runs out.
    fn left(self, now_us: u64) -> Duration {
        let end = self.start_us + WINDOW_US;
        Duration::from_micros(end.saturating_sub(now_us)).max(Duration::from_secs(1))
    }
}

impl WrongTokens {
    /// A token presented by `from` at `now_us`: refused unread if its client is
    /// throttled; else `check`ed, and counted against the client when `check` finds
    /// nothing. The check and the count under one borrow (the caller's lock), so that
    /// concurrent wrong tokens from one client get no more than the limit, however
    /// they interleave: the one rule for every token the relay takes.
    pub(crate) fn present<T>(
        &mut self,
        from: Option<IpAddr>,
        now_us: u64,
        check: impl FnOnce() -> Option<T>,
    ) -> Result<T, Refused> {
        self.check(from, now_us).map_err(Refused::Throttled)?;
        match check() {
            Some(found) => Ok(found),
            None => {
                self.failed(from, now_us);
                Err(Refused::Wrong)
            }
        }
    }

    /// Whether `from` may try now; if not, how long to wait. (A request without a
    /// peer address, which a TCP listener never makes, is not limited.)
    fn check(&mut self, from: Option<IpAddr>, now_us: u64) -> Result<(), Duration> {
        if let Some(addr) = from.map(client) {
            if let Some(w) = self.by_address.get_mut(&addr) {
                *w = w.at(now_us);
                if w.failures >= self.limit {
                    return Err(w.left(now_us));
                }
            }
        }
        Ok(())
    }

    /// Counts a wrong token from `from`.
    fn failed(&mut self, from: Option<IpAddr>, now_us: u64) {
        if let Some(addr) = from.map(client) {
            // Old windows go, so that a scan of many addresses cannot grow the map
            // without bound.
            if self.by_address.len() >= TRACKED {
                let window = WINDOW_US;
                self.by_address.retain(|_, w| now_us.saturating_sub(w.start_us) < window);
                if self.by_address.len() >= TRACKED {
                    self.by_address.clear();
                }
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
        let mut t = WrongTokens::default();
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
    fn a_flood_from_one_client_never_holds_back_another() {
        let mut t = WrongTokens::default();
        for i in 0..1_000u64 {
            if t.check(addr(1), S + i).is_ok() {
                t.failed(addr(1), S + i);
            }
        }
        assert!(t.check(addr(1), 2 * S).is_err());
        for n in 2..=250 {
            assert!(t.check(addr(n), 2 * S).is_ok(), "10.0.0.{n}");
        }
    }

    #[test]
    fn an_ipv6_client_is_its_64_and_a_mapped_ipv4_is_the_ipv4() {
        let mut t = WrongTokens::default();
        let v6 = |last: u16| Some(IpAddr::from([0x2001, 0xdb8, 0, 1, 0, 0, 0, last]));
        for n in 0..PER_ADDRESS {
            t.failed(v6(n as u16), S);
        }
        assert!(t.check(v6(999), S).is_err(), "another address of the same /64");
        assert!(t.check(Some(IpAddr::from([0x2001, 0xdb8, 0, 2, 0, 0, 0, 1])), S).is_ok());
        for _ in 0..PER_ADDRESS {
            t.failed(addr(9), S);
        }
        let mapped = Some(IpAddr::from(std::net::Ipv4Addr::new(10, 0, 0, 9).to_ipv6_mapped()));
        assert!(t.check(mapped, S).is_err());
    }

    #[test]
    fn a_scan_of_many_addresses_keeps_the_map_bounded() {
        let mut t = WrongTokens::default();
        for i in 0..(TRACKED as u32 + 10) {
            t.failed(Some(IpAddr::from(i.to_be_bytes())), S);
        }
        assert!(t.by_address.len() <= TRACKED);
    }

    #[test]
    fn a_right_token_is_not_counted_and_a_throttled_client_is_refused_unread() {
        let mut t = WrongTokens::new(2);
        assert_eq!(t.present(addr(1), 100 * S, || Some(7)), Ok(7));
        assert_eq!(t.present(addr(1), 100 * S, || None::<u8>), Err(Refused::Wrong));
        assert_eq!(
            t.present(addr(1), 100 * S, || Some(7)),
            Ok(7),
            "one failure is within the limit"
        );
        assert_eq!(t.present(addr(1), 100 * S, || None::<u8>), Err(Refused::Wrong));
        let mut read = false;
        let refused = t.present(addr(1), 100 * S, || {
            read = true;
            Some(7)
        });
        assert_eq!(refused, Err(Refused::Throttled(Duration::from_secs(60))));
        assert!(!read, "a throttled client's token is not even compared");
    }

    #[test]
    fn the_wait_is_at_least_a_second() {
        let mut t = WrongTokens::default();
        for _ in 0..PER_ADDRESS {
            t.failed(addr(1), 0);
        }
        assert_eq!(t.check(addr(1), 60 * S - 1).unwrap_err(), Duration::from_secs(1));
    }
}
