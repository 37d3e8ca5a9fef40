//! The pull API's bodies (`/pull/{destination}/...` on the public listener): what a
//! consumer that fetches its deliveries leases, and how it answers for them.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The answer to `POST /pull/{destination}/lease`: the deliveries leased, oldest due
/// first (each resource's next only once its previous one is acknowledged).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Leased {
    pub(crate) deliveries: Vec<LeasedDelivery>,
    /// When these leases end (RFC 3339): a delivery not acknowledged by then is due
    /// again, and leased anew.
    pub(crate) lease_expires_at: String,
}

/// One leased delivery.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct LeasedDelivery {
    /// What to acknowledge (or nack): this lease of the delivery.
    pub(crate) id: String,
    /// The delivery's id, the same on every lease and attempt (`webhook-id`): dedup on
    /// it.
    pub(crate) delivery_id: String,
    pub(crate) event: String,
    pub(crate) source: String,
    /// 1 for the first lease.
    pub(crate) attempt: u32,
    /// The headers an HTTP destination would get (`webhook-*`, `hookrelay-*`,
    /// `traceparent`, `content-type`, the configured ones).
    pub(crate) headers: BTreeMap<String, String>,
    /// The body (the callback's, or the transform's output).
    pub(crate) body: String,
}

/// The body of `POST /pull/{destination}/ack` and `.../nack`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Settle {
    /// The `id`s of leased deliveries (at most 1,000).
    pub(crate) ids: Vec<String>,
    /// nack only: how long before the delivery is due again (`30s`, `5m`); default:
    /// the destination's backoff.
    #[serde(default)]
    pub(crate) delay: Option<String>,
}

/// The answer to an ack or a nack: 200 when every id was taken, 409 when some were
/// refused (the others were still taken).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Settled {
    /// How many were recorded.
    pub(crate) settled: usize,
    /// Those refused, each with why (a lease expired, an unknown id).
    pub(crate) refused: Vec<Refused>,
}

/// An id refused, and why.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Refused {
    pub(crate) id: String,
    pub(crate) why: String,
}
