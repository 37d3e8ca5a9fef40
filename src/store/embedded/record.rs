//! Byte layout of a `deliveries` value: a delivery record in a compact binary form.
//!
//! The record is written at dispatch and again after every attempt, so its size is
//! paid several times per event in sled's log: as JSON it took ~340 bytes, half of
//! them field names and the event id and destination already in its key; this form
//! takes ~70. Layout (integers big-endian):
//!
//! ```text
//! [version = 1][state: u8][created µs: u64][round start µs: u64][round attempts: u32]
//! [total attempts: u32][next attempt µs: opt u64][delivered µs: opt u64]
//! [next in order: opt u64][resource: opt str][last response: opt str][reason: opt str]
//! [attempt count: var] then per attempt [at µs: u64][duration µs: u64][status: opt u16][error: opt str]
//!   [answer: opt str]
//! ```
//! Version 1 (earlier builds, still read) had no reason and no per-attempt answer.
//! `opt x` is a byte 0 (absent) or 1 followed by `x`; `var` a LEB128 integer; `str` is
//! `[length: var][UTF-8]` (`bin.rs`).
//! A value that starts with `{` is the JSON of earlier builds, still read.

use super::bin::{Reader, Writer};
use crate::store::{Attempt, DeliveryRecord, DeliveryState, EventId};

/// The version written; [`V1`] is still read.
const VERSION: u8 = 2;
/// Attempts without their answer.
const V1: u8 = 1;

fn state_byte(s: DeliveryState) -> u8 {
    match s {
        DeliveryState::Pending => 0,
        DeliveryState::Retrying => 1,
        DeliveryState::Delivered => 2,
        DeliveryState::Dead => 3,
        DeliveryState::Discarded => 4,
        DeliveryState::Held => 5,
        DeliveryState::Filtered => 6,
        DeliveryState::Superseded => 7,
    }
}

fn state_of(b: u8) -> Option<DeliveryState> {
    Some(match b {
        0 => DeliveryState::Pending,
        1 => DeliveryState::Retrying,
        2 => DeliveryState::Delivered,
        3 => DeliveryState::Dead,
        4 => DeliveryState::Discarded,
        5 => DeliveryState::Held,
        6 => DeliveryState::Filtered,
        7 => DeliveryState::Superseded,
        _ => return None,
    })
}

/// Encodes a record (its event and destination are the key's).
pub(crate) fn encode(r: &DeliveryRecord) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(48 + r.attempts.len() * 24));
    w.u8(VERSION);
    w.u8(state_byte(r.state));
    w.u64(r.created_us);
    w.u64(r.round_started_us);
    w.u32(r.round_attempts);
    w.u32(r.total_attempts);
    w.opt_u64(r.next_attempt_us);
    w.opt_u64(r.delivered_us);
    w.opt_u64(r.next_in_order.map(EventId::raw));
    w.opt_str(r.resource.as_deref());
    w.opt_str(r.last_response.as_deref());
    w.opt_str(r.reason.as_deref());
    w.var(r.attempts.len() as u64);
    for a in &r.attempts {
        w.u64(a.at_us);
        w.u64(a.duration_us);
        w.opt_u16(a.status);
        w.opt_str(a.error.as_deref());
        w.opt_str(a.answer.as_deref());
    }
    w.0
}

/// Decodes a value of `event`'s delivery to `destination`, binary or legacy JSON.
pub(crate) fn decode(
    event: EventId,
    destination: &str,
    value: &[u8],
) -> Result<DeliveryRecord, String> {
    match value.first() {
        Some(b'{') => serde_json::from_slice(value).map_err(|e| e.to_string()),
        Some(&VERSION) => read(Reader(&value[1..]), event, destination, true),
        Some(&V1) => read(Reader(&value[1..]), event, destination, false),
        Some(v) => Err(format!("unknown delivery record version {v}")),
        None => Err("empty delivery record".into()),
    }
}

fn read(
    mut r: Reader<'_>,
    event: EventId,
    destination: &str,
    answers: bool,
) -> Result<DeliveryRecord, String> {
    let state = r.u8()?;
    let state = state_of(state).ok_or_else(|| format!("unknown state {state}"))?;
    let created_us = r.u64()?;
    let round_started_us = r.u64()?;
    let round_attempts = r.u32()?;
    let total_attempts = r.u32()?;
    let next_attempt_us = r.opt_u64()?;
    let delivered_us = r.opt_u64()?;
    let next_in_order = r.opt_u64()?.map(EventId::new);
    let resource = r.opt_str()?;
    let last_response = r.opt_str()?;
    let reason = if answers { r.opt_str()? } else { None };
    let n = r.count()?;
    let mut attempts = Vec::with_capacity(n);
    for _ in 0..n {
        let at_us = r.u64()?;
        let duration_us = r.u64()?;
        let status = r.opt_u16()?;
        let error = r.opt_str()?;
        let answer = if answers { r.opt_str()? } else { None };
        attempts.push(Attempt { at_us, duration_us, status, error, answer });
    }
    r.end()?;
    Ok(DeliveryRecord {
        event,
        destination: destination.to_owned(),
        state,
        created_us,
        round_started_us,
        round_attempts,
        next_attempt_us,
        total_attempts,
        attempts,
        last_response,
        reason,
        delivered_us,
        resource,
        next_in_order,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn state() -> impl Strategy<Value = DeliveryState> {
        (0u8..8).prop_map(|b| state_of(b).unwrap())
    }

    fn attempt() -> impl Strategy<Value = Attempt> {
        (
            any::<u64>(),
            any::<u64>(),
            any::<Option<u16>>(),
            any::<Option<String>>(),
            any::<Option<String>>(),
        )
            .prop_map(|(at_us, duration_us, status, error, answer)| Attempt {
                at_us,
                duration_us,
                status,
                error,
                answer,
            })
    }

    prop_compose! {
        fn record()(
            state in state(),
            times in any::<(u64, u64, u32, u32)>(),
            opts in any::<(Option<u64>, Option<u64>, Option<u64>)>(),
            resource in any::<Option<String>>(),
            last_response in any::<Option<String>>(),
            reason in any::<Option<String>>(),
            attempts in proptest::collection::vec(attempt(), 0..5),
        ) -> DeliveryRecord {
            DeliveryRecord {
                event: EventId::new(7),
                destination: "crm".into(),
                state,
                created_us: times.0,
                round_started_us: times.1,
                round_attempts: times.2,
                next_attempt_us: opts.0,
                total_attempts: times.3,
                attempts,
                last_response,
                reason,
                delivered_us: opts.1,
                resource,
                next_in_order: opts.2.map(EventId::new),
            }
        }
    }

    proptest! {
        #[test]
        fn every_record_round_trips(r in record()) {
            let bytes = encode(&r);
            prop_assert_eq!(decode(r.event, &r.destination, &bytes), Ok(r.clone()));
            // Any truncation is an error, never a different record.
            for cut in 0..bytes.len() {
                prop_assert!(decode(r.event, &r.destination, &bytes[..cut]).is_err());
            }
        }
    }

    #[test]
    fn reads_the_json_of_earlier_builds_and_is_smaller() {
        let mut r = DeliveryRecord::new(EventId::new(1_763_000_000_000_000), "crm", 42);
        r.push_attempt(Attempt {
            at_us: 43,
            duration_us: 900,
            status: Some(200),
            error: None,
            answer: Some("ok".into()),
        });
        r.state = DeliveryState::Delivered;
        r.delivered_us = Some(44);
        r.last_response = Some("ok".into());
        let json = serde_json::to_vec(&r).unwrap();
        assert_eq!(decode(r.event, "crm", &json), Ok(r.clone()));
        let binary = encode(&r);
        assert!(binary.len() * 3 < json.len(), "{} vs {}", binary.len(), json.len());
        assert!(decode(r.event, "crm", &[9, 0]).unwrap_err().contains("version 9"));
        let mut trailing = binary;
        trailing.push(0);
        assert!(decode(r.event, "crm", &trailing).is_err());
    }

    #[test]
    fn reads_the_version_1_records_of_earlier_builds() {
        let mut r = DeliveryRecord::new(EventId::new(9), "crm", 42);
        r.push_attempt(Attempt {
            at_us: 43,
            duration_us: 900,
            status: Some(503),
            error: None,
            answer: None,
        });
        let v2 = encode(&r);
        // Version 1 is version 2 without the reason and the per-attempt answer (each
        // absent: one byte, the reason's just before the attempts' count).
        let attempts_at = v2.len() - 1 - (8 + 8 + 3 + 1) - 1;
        let mut v1 = vec![V1];
        v1.extend_from_slice(&v2[1..attempts_at - 1]);
        v1.extend_from_slice(&v2[attempts_at..v2.len() - 1]);
        assert_eq!(decode(r.event, "crm", &v1), Ok(r));
    }
}
