//! Replays, previews and discards: what is asked, and what each answered.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::store::EventId;

/// `POST /admin/events/{id}/replay`: which destinations (default: those the event
/// was routed to).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplayRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) destinations: Option<Vec<String>>,
}

/// The answer to `POST /admin/events/{id}/replay`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct EventReplayed {
    pub(crate) event: EventId,
    /// Deliveries scheduled again.
    pub(crate) replayed: usize,
    pub(crate) destinations: Vec<String>,
    /// Destinations asked for whose filter, as configured now, does not match the
    /// event: not replayed, with the reason.
    #[serde(default)]
    pub(crate) filtered: Vec<FilteredReplay>,
}

/// `POST /admin/destinations/{name}/preview`: a stored event, and optionally jq
/// programs to try instead of the destination's own.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PreviewRequest {
    pub(crate) event: EventId,
    /// A filter to try instead of the configured one (`""`: none).
    #[serde(default)]
    pub(crate) filter: Option<String>,
    /// A transform to try instead of the configured one (`""`: none).
    #[serde(default)]
    pub(crate) transform: Option<String>,
}

/// What a destination would make of a stored event: nothing is written or sent.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Preview {
    pub(crate) destination: String,
    pub(crate) event: EventId,
    /// `matched` (it would be delivered) or `filtered`.
    pub(crate) verdict: String,
    /// Why it is filtered.
    pub(crate) reason: Option<String>,
    /// The filter applied (the configured one or the one tried), if any.
    pub(crate) filter: Option<String>,
    /// The transform applied, if any.
    pub(crate) transform: Option<String>,
    /// The content type of the body sent.
    pub(crate) content_type: Option<String>,
    /// The body that would be sent (as text; the transform's output is JSON).
    pub(crate) body: Option<String>,
    /// Why there would be no body: the transform failed (the delivery would be dead).
    pub(crate) body_error: Option<String>,
}

/// A destination a replay left out because its filter does not match.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct FilteredReplay {
    pub(crate) destination: String,
    pub(crate) reason: String,
}

/// `POST /admin/dead-letters/selection/replay|discard`: the dead letters chosen.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Selection {
    /// At most 1,000.
    pub(crate) dead_letters: Vec<DeliveryRef>,
}

/// One delivery: its event and destination.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeliveryRef {
    pub(crate) event: EventId,
    pub(crate) destination: String,
}

/// The answer to `POST /admin/dead-letters/replay`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Replayed {
    pub(crate) replayed: usize,
}

/// The answer to `DELETE /admin/dead-letters`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Deleted {
    pub(crate) deleted: usize,
}
