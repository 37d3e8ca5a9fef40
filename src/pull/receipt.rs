//! A pull lease's id: the claim it stands for (event, due time, token, expiry, attempt
//! number), so that any relay sharing the store takes its ack, and the store checks
//! the claim's token.

use crate::store::EventId;

/// A lease's id: its claim, so that any relay on the store takes the ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Receipt {
    pub(super) event: EventId,
    pub(super) due_us: u64,
    pub(super) token: u64,
    pub(super) expires_us: u64,
    pub(super) attempt: u32,
}

impl Receipt {
    pub(super) fn encode(&self) -> String {
        format!(
            "{}-{:x}-{:x}-{:x}-{:x}",
            self.event, self.due_us, self.token, self.expires_us, self.attempt
        )
    }

    pub(super) fn decode(text: &str) -> Option<Self> {
        let mut parts = text.split('-');
        let event = parts.next()?.parse::<EventId>().ok()?;
        let mut hex = || u64::from_str_radix(parts.next()?, 16).ok();
        let (due_us, token, expires_us) = (hex()?, hex()?, hex()?);
        let attempt = u32::try_from(hex()?).ok()?;
        parts.next().is_none().then_some(Self { event, due_us, token, expires_us, attempt })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receipt_round_trips_and_nothing_else_is_one() {
        let r = Receipt {
            event: EventId::new(0x1234),
            due_us: 99,
            token: u64::MAX,
            expires_us: 1 << 50,
            attempt: 3,
        };
        assert_eq!(Receipt::decode(&r.encode()), Some(r));
        for bad in ["", "x", "0000000000001234-63-ff", &format!("{}-1", r.encode()), "a-b-c-d-e"] {
            assert_eq!(Receipt::decode(bad), None, "{bad}");
        }
    }
}
