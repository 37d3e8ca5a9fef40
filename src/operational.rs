//! Operational events: what the relay has to say about itself (a delivery dead, a
//! circuit opened or closed, a destination paused or stalled, storage low), stored as
//! events named `hookrelay.*` and routed like `hookrelay.HookGap`: only to
//! destinations that name them (`events = ["hookrelay.*"]`), where a transform can turn
//! them into chat messages (docs/operational-events.md).
//!
//! They are raised where the occurrence is already one internal event
//! (`internal_events/`), so the log line, the metric and the stored event cannot
//! drift. Raising never waits: events go through a bounded queue to a task that
//! appends them (one dropped when the queue is full is logged). The queue is a
//! [`Raiser`], one per relay, held by the metrics every internal event's `emit()`
//! reaches; the daemon connects it to its store ([`start`]) and closes it at the stop.
//!
//! Two rules keep them from feeding on themselves: an event about a destination (its
//! resource `destinations/{name}`) is never routed to that destination
//! (`dispatch/`), and the death of a delivery of an operational event raises nothing.

use std::sync::Mutex;
use std::time::SystemTime;

use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::store::{EventId, EventMeta, EventNameOrigin, NewEvent, SharedStore};
use crate::timefmt::format_admin;

/// Events waiting to be appended at most.
const QUEUE: usize = 1024;

/// One relay's way to its appending task: nothing until the daemon connects it
/// ([`start`]), nothing again once it is closed.
#[derive(Default)]
pub(crate) struct Raiser(Mutex<Option<Connected>>);

/// The connected side of a [`Raiser`].
struct Connected {
    queue: mpsc::Sender<NewEvent>,
    /// The names some destination takes: the others are not raised at all (stored
    /// for nobody, they would only crowd the event listings).
    wanted: Vec<&'static str>,
    /// The source they are stored under.
    source: String,
    /// Told of an event lost (its queue full, or its append failed), with why: the
    /// daemon counts and logs it as an internal event (this module sits below them).
    lost: Lost,
}

/// What [`start`]'s caller is told of an operational event that was lost: its name,
/// and why.
pub(crate) type Lost = std::sync::Arc<dyn Fn(&str, &dyn std::fmt::Display) + Send + Sync>;

impl Raiser {
    /// Queues `event` for the appending task, never waiting. Nothing happens before
    /// the daemon connected it (unit tests) or after it closed it, nor for the death of
    /// a delivery of an operational event (they would feed on each other).
    pub(crate) fn raise(&self, event: &OperationalEvent<'_>) {
        if let OperationalEvent::DeliveryDead { event_name, .. } = event {
            if NAMES.contains(event_name) {
                return;
            }
        }
        let connected = crate::lock::lock(&self.0);
        let Some(c) = connected.as_ref().filter(|c| c.wanted.contains(&event.name())) else {
            return;
        };
        if c.queue.try_send(event.to_event(&c.source, crate::clock::now())).is_err() {
            (c.lost)(event.name(), &"its queue is full or closed");
        }
    }

    /// Raises only the `wanted` names from now on, listed under `source` (a reload).
    pub(crate) fn want(&self, source: &str, wanted: Vec<&'static str>) {
        if let Some(connected) = crate::lock::lock(&self.0).as_mut() {
            connected.wanted = wanted;
            connected.source = source.to_owned();
        }
    }

    /// Disconnects it: the appending task stores what is queued, then ends.
    pub(crate) fn close(&self) {
        crate::lock::lock(&self.0).take();
    }
}

/// What the relay reports.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum OperationalEvent<'a> {
    /// A delivery gave up (retries exhausted, or a permanent failure).
    DeliveryDead {
        destination: &'a str,
        event: EventId,
        source: &'a str,
        event_name: &'a str,
        resource: Option<&'a str>,
        status: Option<u16>,
        error: Option<&'a str>,
    },
    CircuitOpened {
        destination: &'a str,
    },
    CircuitClosed {
        destination: &'a str,
    },
    /// Paused by `by`: `gone` (the consumer answered 410) or `admin`.
    DestinationPaused {
        destination: &'a str,
        by: &'a str,
    },
    /// Deliveries due and no attempt started for `idle_s`.
    DestinationStalled {
        destination: &'a str,
        idle_s: u64,
    },
    /// Free space of the data directory crossed the floor: `low` true below it, false
    /// back above.
    StorageLow {
        data_dir: &'a str,
        low: bool,
        free_bytes: u64,
        floor_bytes: u64,
    },
    /// A destination's `filter` or `transform` (`role`) was stopped too many runs in a
    /// row or within an hour, and the relay no longer runs it until the config is fixed.
    ProgramDisabled {
        destination: &'a str,
        role: &'a str,
        reason: &'a str,
    },
    /// A change made through the admin API or the console, as journalled.
    AdminAction {
        who: &'a str,
        from: Option<&'a str>,
        action: &'a str,
        target: &'a str,
        count: u64,
        result: &'a str,
    },
}

/// The names, for docs and checks (kept with every other name the relay knows).
pub(crate) use crate::event_names::OPERATIONAL as NAMES;

impl OperationalEvent<'_> {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::DeliveryDead { .. } => NAMES[0],
            Self::CircuitOpened { .. } => NAMES[1],
            Self::CircuitClosed { .. } => NAMES[2],
            Self::DestinationPaused { .. } => NAMES[3],
            Self::DestinationStalled { .. } => NAMES[4],
            Self::StorageLow { .. } => NAMES[5],
            Self::ProgramDisabled { .. } => NAMES[6],
            Self::AdminAction { .. } => NAMES[7],
        }
    }

    /// The resource it is about (`type`, `id`) and its attributes.
    fn about(&self) -> (&'static str, String, Value) {
        match *self {
            Self::DeliveryDead {
                destination,
                event,
                source,
                event_name,
                resource,
                status,
                error,
            } => (
                "destinations",
                destination.to_owned(),
                json!({"event": event.to_string(), "source": source, "eventName": event_name,
                       "resource": resource, "status": status, "error": error}),
            ),
            Self::CircuitOpened { destination } | Self::CircuitClosed { destination } => {
                ("destinations", destination.to_owned(), json!({}))
            }
            Self::DestinationPaused { destination, by } => {
                ("destinations", destination.to_owned(), json!({"by": by}))
            }
            Self::DestinationStalled { destination, idle_s } => {
                ("destinations", destination.to_owned(), json!({"idleSeconds": idle_s}))
            }
            Self::StorageLow { data_dir, low, free_bytes, floor_bytes } => (
                "storage",
                data_dir.to_owned(),
                json!({"low": low, "freeBytes": free_bytes, "floorBytes": floor_bytes}),
            ),
            Self::ProgramDisabled { destination, role, reason } => {
                ("destinations", destination.to_owned(), json!({"program": role, "reason": reason}))
            }
            Self::AdminAction { who, from, action, target, count, result } => {
                let target: Value = serde_json::from_str(target).unwrap_or(Value::Null);
                let attributes = json!({"action": action, "from": from, "target": target,
                                        "count": count, "result": result});
                ("admins", who.to_owned(), attributes)
            }
        }
    }

    /// The stored event, raised at `now` by source `source` (its body in the
    /// upstream's shape: `data` names what it is about).
    pub(crate) fn to_event(&self, source: &str, now: SystemTime) -> NewEvent {
        let (kind, id, attributes) = self.about();
        let body = json!({
            "data": {"type": kind, "id": id, "attributes": attributes},
            "meta": {"hookrelay": {"event": self.name(), "at": format_admin(now)}},
        })
        .to_string();
        NewEvent::internal(source, self.name(), body, Some(format!("{kind}/{id}")), now)
    }
}

/// The destination an internal event of `meta` reports on, which never receives it.
pub(crate) fn reported_on(meta: &EventMeta) -> Option<&str> {
    if meta.event_from != EventNameOrigin::Internal {
        return None;
    }
    meta.resource.as_deref()?.strip_prefix("destinations/")
}

/// Connects `raiser` to a task that appends raised events to `store` under source
/// `source` (the first configured source: they are listed under it; routing ignores
/// the source of an operational event), until the raiser is closed. Only the `wanted`
/// names (those some destination takes) are raised.
pub(crate) fn start(
    raiser: &Raiser,
    store: SharedStore,
    source: &str,
    wanted: Vec<&'static str>,
    lost: Lost,
) -> tokio::task::JoinHandle<()> {
    let (queue, mut rx) = mpsc::channel::<NewEvent>(QUEUE);
    let source = source.to_owned();
    *crate::lock::lock(&raiser.0) = Some(Connected { queue, wanted, source, lost: lost.clone() });
    tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            let name = event.meta.event.clone();
            match store.append(event).await {
                Ok(id) => tracing::debug!(%id, event = %name, "operational event stored"),
                Err(e) => lost(&name, &format_args!("not stored: {e}")),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_names_what_it_is_about_and_whom_it_is_never_sent_to() {
        let dead = OperationalEvent::DeliveryDead {
            destination: "crm",
            event: EventId::new(0x10),
            source: "demo",
            event_name: "ActionCreated",
            resource: Some("actions/5"),
            status: Some(400),
            error: Some("HTTP 400"),
        };
        let e = dead.to_event("demo", SystemTime::UNIX_EPOCH);
        assert_eq!(e.meta.event, "hookrelay.DeliveryDead");
        assert_eq!(reported_on(&e.meta), Some("crm"));
        let body: Value = serde_json::from_slice(e.body.as_deref().unwrap()).unwrap();
        assert_eq!(body["data"]["attributes"]["status"], 400);
        assert_eq!(body["data"]["attributes"]["event"], "0000000000000010");
        let low = OperationalEvent::StorageLow {
            data_dir: "/var/lib/hookrelay",
            low: true,
            free_bytes: 1,
            floor_bytes: 2,
        };
        assert_eq!(reported_on(&low.to_event("demo", SystemTime::UNIX_EPOCH).meta), None);
        for (e, name) in [
            (OperationalEvent::CircuitOpened { destination: "a" }, "hookrelay.CircuitOpened"),
            (OperationalEvent::CircuitClosed { destination: "a" }, "hookrelay.CircuitClosed"),
            (
                OperationalEvent::DestinationPaused { destination: "a", by: "admin" },
                "hookrelay.DestinationPaused",
            ),
            (
                OperationalEvent::DestinationStalled { destination: "a", idle_s: 60 },
                "hookrelay.DestinationStalled",
            ),
            (low, "hookrelay.StorageLow"),
            (
                OperationalEvent::AdminAction {
                    who: "crm-team",
                    from: None,
                    action: "replay",
                    target: "{}",
                    count: 1,
                    result: "ok",
                },
                "hookrelay.AdminAction",
            ),
        ] {
            assert_eq!(e.name(), name);
            assert!(crate::event_names::is_internal(name), "{name}");
            assert_eq!(crate::event_names::metric_label(name), name);
        }
    }

    /// An event that finds the queue full is not silently gone: the caller's `lost`
    /// hears its name and why (the daemon counts it); the ones queued are stored.
    #[tokio::test]
    async fn an_event_the_queue_cannot_take_is_reported_lost() {
        let store: crate::store::SharedStore =
            std::sync::Arc::new(crate::store::memory::MemoryStore::default());
        let raiser = Raiser::default();
        let seen = std::sync::Arc::new(Mutex::new(Vec::<String>::new()));
        let heard = seen.clone();
        let lost: Lost = std::sync::Arc::new(move |name, why| {
            crate::lock::lock(&heard).push(format!("{name}: {why}"));
        });
        let wanted = vec!["hookrelay.CircuitOpened"];
        let task = start(&raiser, store.clone(), "demo", wanted, lost);
        // On this one-thread runtime the appending task does not run before the
        // loop yields: the queue fills, and the one past it is lost.
        for _ in 0..=QUEUE {
            raiser.raise(&OperationalEvent::CircuitOpened { destination: "crm" });
        }
        assert_eq!(
            *crate::lock::lock(&seen),
            vec!["hookrelay.CircuitOpened: its queue is full or closed".to_owned()]
        );
        raiser.close();
        task.await.unwrap();
        let stored = store.inbox().await.unwrap().events;
        assert_eq!(stored, QUEUE as u64, "every queued event is stored");
    }
}
