//! What operators and retention may do: replay, discard, prune.

use super::{Staged, View};
use crate::store::{DeliveryRecord, DeliveryState, EventId, EventMeta, StoreError};

/// Starts a new round for the delivery of `event` to `dest` (creating it if the event
/// was never routed there), due at `now_us`; dead, delivered or discarded deliveries
/// become pending. Returns false, changing nothing, when the event has no final record
/// (still in the inbox, or pruned) or was rejected (no body) or the delivery is `held` (it is delivered in its
/// turn anyway).
pub(crate) fn replay<V: View + ?Sized>(
    st: &mut Staged<'_, V>,
    event: EventId,
    dest: &str,
    now_us: u64,
) -> Result<bool, StoreError> {
    let replayable = st.event(event)?.is_some_and(|m| {
        !matches!(
            m.status,
            crate::store::EventStatus::Received | crate::store::EventStatus::Rejected
        )
    });
    if !replayable {
        return Ok(false);
    }
    let mut record = match st.delivery(event, dest)? {
        Some(r) if r.state == DeliveryState::Held => return Ok(false),
        Some(r) => r,
        None => DeliveryRecord::new(event, dest, now_us),
    };
    record.restart(now_us);
    st.put_delivery(record)?;
    Ok(true)
}

/// Deletes a dead letter: the delivery becomes `discarded` (kept in the event's history,
/// never retried, prunable). Returns false if it was not dead.
pub(crate) fn discard<V: View + ?Sized>(
    st: &mut Staged<'_, V>,
    event: EventId,
    dest: &str,
) -> Result<bool, StoreError> {
    match st.delivery(event, dest)? {
        Some(mut r) if r.state == DeliveryState::Dead => {
            r.state = DeliveryState::Discarded;
            st.put_delivery(r)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// How an admin request changes each delivery it names (one rule for every
/// backend: [`manage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Managed {
    /// [`replay`], whatever the delivery's state (an event's replay).
    Replay,
    /// [`replay`] only a delivery still `dead` (a dead letter's replay: one replayed or
    /// discarded meanwhile is left alone).
    ReplayDead,
    /// [`discard`] (only a dead one is discarded).
    Discard,
}

/// Applies `how` to each of `deliveries`; how many it changed.
pub(crate) fn manage<V: View + ?Sized>(
    st: &mut Staged<'_, V>,
    deliveries: &[(EventId, String)],
    how: Managed,
    now_us: u64,
) -> Result<u64, StoreError> {
    let mut changed = 0;
    for (event, dest) in deliveries {
        let done = match how {
            Managed::Replay => replay(st, *event, dest, now_us)?,
            Managed::ReplayDead => {
                let dead =
                    st.delivery(*event, dest)?.is_some_and(|r| r.state == DeliveryState::Dead);
                dead && replay(st, *event, dest, now_us)?
            }
            Managed::Discard => discard(st, *event, dest)?,
        };
        changed += u64::from(done);
    }
    Ok(changed)
}

/// Whether retention may delete an event received before `before_us`: it left the
/// inbox, and every delivery of it succeeded, was filtered out or was discarded (or it
/// had none). Dead
/// letters and anything scheduled or held keep their event.
pub(crate) fn prunable(meta: &EventMeta, deliveries: &[DeliveryRecord], before_us: u64) -> bool {
    meta.status != crate::store::EventStatus::Received
        && meta.received_at_us < before_us
        && deliveries.iter().all(|d| d.state.is_settled())
}

/// Retention by part at settlement: drops the body of `event` (its record,
/// deliveries and attempts stay) when the change staged last settled it, as
/// [`prunable`] at `bodies_before_us` says (`retention.delivered_bodies` ago). The pass
/// over events by age drops the bodies of events settled when it reaches them; an
/// event settling later (a consumer down longer than the body's retention, a dispatch
/// behind a flood) is past that pass, and loses its body here. Ids are the receive
/// time: a younger event is passed over without a read. Returns whether it went.
pub(crate) fn drop_body_if_settled<V: View + ?Sized>(
    st: &mut Staged<'_, V>,
    event: EventId,
    bodies_before_us: u64,
) -> Result<bool, StoreError> {
    if event.raw() >= bodies_before_us || st.changes.bodies_dropped.contains(&event) {
        return Ok(false);
    }
    let Some(meta) = st.event(event)? else { return Ok(false) };
    if !prunable(&meta, &st.deliveries_of(event)?, bodies_before_us) {
        return Ok(false);
    }
    st.changes.bodies_dropped.insert(event);
    Ok(true)
}

/// Stages the deletion of `id` with its body and `deliveries` (all of them, read
/// together with `meta` under the backend's lock) if [`prunable`]; returns whether.
pub(crate) fn prune<V: View + ?Sized>(
    st: &mut Staged<'_, V>,
    id: EventId,
    meta: &EventMeta,
    deliveries: &[DeliveryRecord],
    before_us: u64,
) -> Result<bool, StoreError> {
    if !prunable(meta, deliveries, before_us) {
        return Ok(false);
    }
    for d in deliveries {
        st.set_delivery(id, &d.destination, None)?;
    }
    st.changes.pruned.push((id, meta.resource.clone()));
    Ok(true)
}
