//! Dispatch of one received event: the dedup verdict, fan-out, per-resource queues.

use super::{DedupEntry, Queue, Staged, View};
use crate::store::{
    resource_hex, DeliveryRecord, DeliveryState, DispatchPlan, DispatchVerdict, EventId, EventMeta,
    EventStatus, StoreError,
};

/// Decides what becomes of the received event `meta` under `plan` at `now_us`, and
/// stages it: its final record, its dedup key, one delivery per destination (due now,
/// `held` behind an earlier delivery of the same resource to an ordered destination, or
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
        let mut superseded = Vec::new();
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
                if plan.latest.contains(dest) {
                    let n = join_latest(st, &mut record, &resource, now_us)?;
                    superseded.extend(std::iter::repeat_n(dest.clone(), n));
                } else {
                    join_queue(st, &mut record, &resource)?;
                }
            }
            st.put_delivery(record)?;
        }
        DispatchVerdict::Dispatched { deliveries: plan.destinations.len(), superseded }
    };
    st.changes.dispatched.insert(plan.id, meta);
    Ok(outcome)
}

/// Per-resource order: the delivery joins its resource's queue. The first one is the
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

/// `ordering = "latest"`: the delivery supersedes those of its resource still
/// waiting: the one held behind the head, and the head itself unless a worker holds a
/// claim on it (its attempt may be in flight, and the newer one must not overtake it:
/// it waits behind it instead). So a queue holds at most the head and one waiting.
/// Returns how many it superseded.
fn join_latest<V: View + ?Sized>(
    st: &mut Staged<'_, V>,
    record: &mut DeliveryRecord,
    resource: &[u8; 16],
    now_us: u64,
) -> Result<usize, StoreError> {
    let dest = record.destination.clone();
    let key = (dest.clone(), *resource);
    let Some(q) = st.queue(&dest, resource)? else {
        st.changes
            .queues
            .insert(key, Some(Queue { head: record.event, tail: record.event, len: 1 }));
        return Ok(0);
    };
    let by = record.event;
    let mut superseded = 0;
    if q.tail != q.head {
        supersede(st, q.tail, &dest, by)?;
        superseded += 1;
    }
    let Some(mut head) = st.delivery(q.head, &dest)? else {
        // A queue without its head cannot be; start it again with this one.
        st.changes.queues.insert(key, Some(Queue { head: by, tail: by, len: 1 }));
        return Ok(superseded);
    };
    if head.state.is_scheduled() && !st.claimed(q.head, &dest, now_us)? {
        supersede(st, q.head, &dest, by)?;
        st.changes.queues.insert(key, Some(Queue { head: by, tail: by, len: 1 }));
        return Ok(superseded + 1);
    }
    head.next_in_order = Some(by);
    st.put_delivery(head)?;
    record.state = DeliveryState::Held;
    record.next_attempt_us = None;
    st.changes.queues.insert(key, Some(Queue { head: q.head, tail: by, len: 2 }));
    Ok(superseded)
}

/// Marks the delivery of `event` to `dest` superseded by the newer `by`.
fn supersede<V: View + ?Sized>(
    st: &mut Staged<'_, V>,
    event: EventId,
    dest: &str,
    by: EventId,
) -> Result<(), StoreError> {
    if let Some(mut old) = st.delivery(event, dest)? {
        old.state = DeliveryState::Superseded;
        old.next_attempt_us = None;
        old.next_in_order = None;
        old.reason = Some(format!("superseded by event {by}, a newer update of the same resource"));
        st.put_delivery(old)?;
    }
    Ok(())
}
