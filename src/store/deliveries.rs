//! What the store keeps about dispatch and deliveries.

use serde::{Deserialize, Serialize};

use super::{EventId, EventMeta};

/// A received event taken from the inbox for dispatch.
#[derive(Clone, Debug)]
pub(crate) struct PendingEvent {
    pub(crate) id: EventId,
    pub(crate) meta: EventMeta,
    pub(crate) body: bytes::Bytes,
}

/// The inbox, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct InboxStats {
    /// Events stored and waiting for dispatch.
    pub(crate) events: u64,
    /// The backend is still counting its inbox after it opened (the embedded store
    /// counts it behind the open, seconds for a million events a flood left
    /// undispatched): `events` is a lower bound until it is done.
    pub(crate) counting: bool,
}

/// What the dispatcher decided about one pending event; the store applies it
/// atomically (dedup check, event record, deliveries, schedule, inbox removal).
#[derive(Clone, Debug)]
pub(crate) struct DispatchPlan {
    pub(crate) id: EventId,
    /// The dedup key and how long it holds, if deduplication applies.
    pub(crate) dedup: Option<DedupKey>,
    /// Destinations that want the event.
    pub(crate) destinations: Vec<String>,
    /// Those of `destinations` whose filter did not match: each gets a `filtered`
    /// delivery, never attempted.
    pub(crate) filtered: Vec<FilteredOut>,
    /// Those of `ordered` with `ordering = "latest"`.
    pub(crate) latest: Vec<String>,
    /// Those of `destinations` that deliver per resource in order.
    pub(crate) ordered: Vec<String>,
    /// The resource the event is about (hash of source, `data.type`, `data.id`), if
    /// the body names one.
    pub(crate) resource: Option<[u8; 16]>,
}

#[cfg(test)]
impl DispatchVerdict {
    /// Dispatched to `deliveries` destinations, superseding nothing.
    pub(crate) fn dispatched(deliveries: usize) -> Self {
        Self::Dispatched { deliveries, superseded: Vec::new() }
    }
}

/// A destination whose filter did not match an event, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FilteredOut {
    pub(crate) destination: String,
    pub(crate) reason: String,
    /// The filter failed or gave something other than a boolean (a bug of the
    /// filter), rather than `false` or nothing.
    pub(crate) error: bool,
}

/// A deduplication key: a hash of the source, the event name and the identifying
/// parts of the body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DedupKey {
    pub(crate) hash: [u8; 16],
    pub(crate) window_us: u64,
}

/// What dispatch did with an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DispatchVerdict {
    /// Deliveries were created for this many destinations; those of the destinations
    /// named in `superseded` (`ordering = "latest"`) superseded older ones.
    Dispatched { deliveries: usize, superseded: Vec<String> },
    /// The same occurrence was already dispatched as `original`.
    Duplicate { original: EventId },
    /// No destination wants it.
    Unrouted,
    /// It was no longer in the inbox (already dispatched).
    Gone,
}

/// Where a delivery stands.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DeliveryState {
    /// Scheduled, never attempted (or replayed).
    Pending,
    /// Attempted, failed, scheduled again.
    Retrying,
    /// A 2xx answer was received.
    Delivered,
    /// Given up; waits in the dead letters for a replay.
    Dead,
    /// A dead letter an operator deleted: never retried, pruned with its event.
    Discarded,
    /// Waits for an earlier delivery of the same resource to the same destination
    /// (`ordering = "per-resource"`); not in the schedule until that one finishes.
    Held,
    /// Routed, but the destination's `filter` did not match (its `reason` says why):
    /// never attempted, pruned like a delivered one.
    Filtered,
    /// A newer update of the same resource came for an `ordering = "latest"`
    /// destination before this one was sent (its `reason` names it): never attempted
    /// again, pruned like a delivered one.
    Superseded,
}

impl DeliveryState {
    /// The state's name, as the API, the ledger and PostgreSQL's `state` column say it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Retrying => "retrying",
            Self::Delivered => "delivered",
            Self::Dead => "dead",
            Self::Discarded => "discarded",
            Self::Held => "held",
            Self::Filtered => "filtered",
            Self::Superseded => "superseded",
        }
    }

    /// Whether the delivery has an entry in the schedule.
    pub(crate) fn is_scheduled(self) -> bool {
        matches!(self, Self::Pending | Self::Retrying)
    }

    /// Whether nothing more is owed on the delivery (what retention waits for): done,
    /// or never to be made. A dead letter is not: it waits for a replay.
    pub(crate) fn is_settled(self) -> bool {
        matches!(self, Self::Delivered | Self::Discarded | Self::Filtered | Self::Superseded)
    }
}

/// One HTTP attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Attempt {
    pub(crate) at_us: u64,
    pub(crate) duration_us: u64,
    /// The answer's status, if there was an answer.
    pub(crate) status: Option<u16>,
    /// What went wrong (timeout, connection refused, status class...).
    pub(crate) error: Option<String>,
    /// The start of the answer's body (or why nothing was sent), kept on the latest
    /// [`ANSWERS_KEPT`] attempts only: the record is rewritten after every attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) answer: Option<String>,
}

/// Attempts kept per delivery; older ones are dropped (their count is kept).
pub(crate) const MAX_KEPT_ATTEMPTS: usize = 100;

/// Attempts that keep the start of their answer: up to 512 bytes each, so a delivery
/// retried a hundred times rewrites ~5 KB per attempt, not ~50 KB.
pub(crate) const ANSWERS_KEPT: usize = 10;

/// One event's delivery to one destination.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct DeliveryRecord {
    pub(crate) event: EventId,
    pub(crate) destination: String,
    pub(crate) state: DeliveryState,
    pub(crate) created_us: u64,
    /// Start of the current round of attempts (creation or last replay):
    /// `give_up_after` and `max_attempts` count from here.
    pub(crate) round_started_us: u64,
    pub(crate) round_attempts: u32,
    /// When the next attempt is due, while scheduled.
    pub(crate) next_attempt_us: Option<u64>,
    pub(crate) total_attempts: u32,
    /// The latest attempts, oldest first (at most [`MAX_KEPT_ATTEMPTS`]).
    pub(crate) attempts: Vec<Attempt>,
    /// The start of the last answer's body, for diagnosis.
    pub(crate) last_response: Option<String>,
    /// Why the delivery ended without an answer: the filter's verdict (`filtered`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    pub(crate) delivered_us: Option<u64>,
    /// For per-resource ordering: the resource key (hex), and the next delivery of
    /// the same resource to the same destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) resource: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) next_in_order: Option<EventId>,
}

impl DeliveryRecord {
    /// A new delivery, due at once.
    pub(crate) fn new(event: EventId, destination: &str, now_us: u64) -> Self {
        Self {
            event,
            destination: destination.to_owned(),
            state: DeliveryState::Pending,
            created_us: now_us,
            round_started_us: now_us,
            round_attempts: 0,
            next_attempt_us: Some(now_us),
            total_attempts: 0,
            attempts: Vec::new(),
            last_response: None,
            reason: None,
            delivered_us: None,
            resource: None,
            next_in_order: None,
        }
    }

    /// Adds an attempt to the history.
    pub(crate) fn push_attempt(&mut self, attempt: Attempt) {
        if self.attempts.len() >= MAX_KEPT_ATTEMPTS {
            self.attempts.remove(0);
        }
        self.attempts.push(attempt);
        if let Some(older) = self.attempts.len().checked_sub(ANSWERS_KEPT + 1) {
            self.attempts[older].answer = None;
        }
        self.round_attempts += 1;
        self.total_attempts += 1;
    }

    /// Starts a new round of attempts now (replay).
    pub(crate) fn restart(&mut self, now_us: u64) {
        self.state = DeliveryState::Pending;
        self.round_started_us = now_us;
        self.round_attempts = 0;
        self.next_attempt_us = Some(now_us);
        self.delivered_us = None;
    }
}

/// A delivery claimed for one attempt: by whom, until when, and the record as it was
/// when claimed (what the attempt sends).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Claim {
    pub(crate) event: EventId,
    pub(crate) destination: String,
    /// The due time it was claimed at: recording checks the delivery is still there.
    pub(crate) due_us: u64,
    /// Who holds it (a relay's id).
    pub(crate) owner: String,
    /// Tells this claim from a later one on the same delivery.
    pub(crate) token: u64,
    pub(crate) expires_us: u64,
    pub(crate) record: DeliveryRecord,
    /// The event and its body as stored (`None` if no longer stored): what the attempt
    /// sends, read with the claim so that an attempt costs one store call before it.
    pub(crate) meta: Option<EventMeta>,
    pub(crate) body: Option<bytes::Bytes>,
}

/// What became of a recorded attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttemptWrite {
    /// Written; the delivery moved on by this verdict.
    Done(super::lifecycle::AttemptVerdict),
    /// The delivery was replayed, moved or deleted meanwhile: nothing written.
    Stale,
    /// The claim's lease expired and someone else claimed it: nothing written.
    ClaimLost,
}

/// What recording a group of attempts did: each attempt's write, in order, and how
/// many events it settled lost their body with it (received before the cutoff of
/// `retention.delivered_bodies`), for the metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Recorded {
    pub(crate) writes: Vec<AttemptWrite>,
    pub(crate) bodies_dropped: usize,
}

/// Hex form of a resource key, as kept in delivery records.
pub(crate) fn resource_hex(resource: &[u8; 16]) -> String {
    hex(resource)
}

/// Bytes as lowercase hex: the one spelling of bytes in text (resource keys in the
/// API, store keys in error messages).
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}"); // writing to a String cannot fail
    }
    out
}

/// Parses [`resource_hex`] back.
pub(crate) fn resource_from_hex(text: &str) -> Option<[u8; 16]> {
    if text.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A destination's queue, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct QueueStats {
    pub(crate) pending: u64,
    /// Waiting behind an earlier delivery of the same resource.
    pub(crate) held: u64,
    pub(crate) retrying: u64,
    pub(crate) dead: u64,
    /// Id of the oldest event still scheduled, to the second ([`QueueStats::second_of`]:
    /// ids start from the receive time in µs).
    pub(crate) oldest: Option<EventId>,
    /// The backend is still counting its queues after it opened (the embedded store
    /// counts them behind the open, seconds for millions of deliveries): the numbers
    /// are a lower bound until it is done.
    pub(crate) counting: bool,
}

impl QueueStats {
    /// An id rounded down to its second, what [`QueueStats::oldest`] holds: the age it
    /// gives is a gauge in seconds, and a backend that keeps the queue in memory keeps
    /// one count per second of receive time, not one entry per scheduled delivery
    /// (10 million pending deliveries were ~300 MB of a sled relay's memory).
    pub(crate) fn second_of(id: EventId) -> EventId {
        EventId::new(id.raw() / 1_000_000 * 1_000_000)
    }
}

/// Which dead letters to list or replay.
#[derive(Clone, Debug, Default)]
pub(crate) struct DeadLetterFilter {
    pub(crate) source: Option<String>,
    pub(crate) event: Option<String>,
    pub(crate) destination: Option<String>,
    /// Only those of events older than this one (a page's cursor, or "received
    /// before": an id is its receive time).
    pub(crate) after: Option<EventId>,
    /// Only those of this event or later ones (received at or after its time).
    pub(crate) since: Option<EventId>,
    pub(crate) limit: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_latest_attempts_keep_their_answer_and_at_most_a_hundred_are_kept() {
        let mut r = DeliveryRecord::new(EventId::new(1), "crm", 0);
        for at_us in 0..150 {
            let answer = Some(format!("answer {at_us}"));
            r.push_attempt(Attempt {
                at_us,
                duration_us: 1,
                status: Some(500),
                error: None,
                answer,
            });
        }
        assert_eq!(r.total_attempts, 150);
        assert_eq!(r.attempts.len(), MAX_KEPT_ATTEMPTS);
        assert_eq!(r.attempts[0].at_us, 50);
        let answered: Vec<u64> =
            r.attempts.iter().filter(|a| a.answer.is_some()).map(|a| a.at_us).collect();
        assert_eq!(answered, (140..150).collect::<Vec<_>>());
        assert_eq!(r.attempts[MAX_KEPT_ATTEMPTS - 1].answer.as_deref(), Some("answer 149"));
    }
}
