//! Dispatch of one received event: the dedup verdict, fan-out, per-resource queues.

use super::{DedupEntry, Queue, Staged, View};
use crate::store::{
    resource_hex, DeliveryRecord, DeliveryState, DispatchPlan, DispatchVerdict, EventMeta,
    EventStatus, StoreError,
};

/// Decides what becomes of the received event `meta` under `plan` at `now_us`, and
/// stages it: its final record, its dedup key, one delivery per destination (due now,
/// `held` behind an earlier delivery of the same record to an ordered destination, or
/// `filtered` when the destination's filter did not match: never scheduled or queued).
///
/// The dedup verdict: a key held by another event whose window has not ended at this
/// event's receive time makes it a `duplicate`; otherwise this event takes (or renews)
/// the key for `window_us` from its receive time.
pub(crate) fn dispatch<V: View + ?Sized>(
    st: &mut Staged<'_, V>,
    mut meta: EventMeta,
    plan: &DispatchPlan,
    now_us: u64,
) -> Result<DispatchVerdict, StoreError> {
    let mut duplicate_of = None;
    if let Some(dk) = &plan.dedup {
        match st.dedup(&dk.hash)? {
            Some(held) if held.until_us > meta.received_at_us && held.original != plan.id => {
                duplicate_of = Some(held.original);
            }
            _ => {
                let until_us = meta.received_at_us.saturating_add(dk.window_us);
                st.changes.dedup.insert(dk.hash, DedupEntry { original: plan.id, until_us });
            }
        }
    }
    let outcome = if let Some(original) = duplicate_of {
        meta.status = EventStatus::Duplicate;
        meta.duplicate_of = Some(original);
        DispatchVerdict::Duplicate { original }
    } else if plan.destinations.is_empty() {
        meta.status = EventStatus::Unrouted;
        DispatchVerdict::Unrouted
    } else {
        meta.status = EventStatus::Dispatched;
        meta.destinations.clone_from(&plan.destinations);
        for dest in &plan.destinations {
            let mut record = DeliveryRecord::new(plan.id, dest, now_us);
            if let Some(out) = plan.filtered.iter().find(|f| &f.destination == dest) {
                record.state = DeliveryState::Filtered;
                record.next_attempt_us = None;
                record.reason = Some(out.reason.clone());
                st.put_delivery(record)?;
                continue;
            }
            if let Some(resource) = plan.resource.filter(|_| plan.ordered.contains(dest)) {
                record.resource = Some(resource_hex(&resource));
                join_queue(st, &mut record, &resource)?;
            }
            st.put_delivery(record)?;
        }
        DispatchVerdict::Dispatched(plan.destinations.len())
    };
    st.changes.dispatched.insert(plan.id, meta);
    Ok(outcome)
}

/// Per-resource order: the delivery joins its record's queue. The first one is the
/// head and stays due now; a later one is `held` and linked from the current tail.
fn join_queue<V: View + ?Sized>(
    st: &mut Staged<'_, V>,
    record: &mut DeliveryRecord,
    resource: &[u8; 16],
) -> Result<(), StoreError> {
    let dest = record.destination.clone();
    let key = (dest.clone(), *resource);
    let queue = match st.queue(&dest, resource)? {
        None => Queue { head: record.event, tail: record.event, len: 1 },
        Some(q) => {
            if let Some(mut tail) = st.delivery(q.tail, &dest)? {
                tail.next_in_order = Some(record.event);
                st.put_delivery(tail)?;
            }
            record.state = DeliveryState::Held;
            record.next_attempt_us = None;
            Queue { head: q.head, tail: record.event, len: q.len + 1 }
        }
    };
    st.changes.queues.insert(key, Some(queue));
    Ok(())
}
