//! A callback's end at the ingress: stored (or recorded as rejected), refused, closed
//! unanswered, or not stored. Each is counted under its outcome, with its duration.

use std::time::Duration;

use super::taxonomy::{self, ErrorType, Stage, ERRORS};
use super::InternalEvent;
use crate::metrics::{ingress_outcome, Metrics};
use crate::store::EventId;

#[cfg_attr(not(test), allow(dead_code))]
const FAMILIES: &[&str] =
    &["hookrelay_ingress_requests_total", "hookrelay_ingress_request_duration_seconds"];

/// Counts one callback's outcome and how long it took.
fn count(m: &Metrics, source: &str, outcome: &str, took: Duration) {
    m.ingress.ingress_requests.with_label_values(&[source, outcome]).inc();
    m.ingress.ingress_duration.observe(took.as_secs_f64());
}

/// Stored and answered 200: received (to the inbox), or rejected (too large: its
/// record only, so that the hook is not disabled).
pub(crate) struct CallbackStored<'a> {
    pub(crate) id: EventId,
    pub(crate) source: &'a str,
    pub(crate) event: &'a str,
    pub(crate) rejected: bool,
    pub(crate) took: Duration,
}

impl InternalEvent for CallbackStored<'_> {
    const FAMILIES: &'static [&'static str] = FAMILIES;
    fn emit(self, m: &Metrics) {
        let Self { id, source, event, rejected, took } = self;
        if rejected {
            count(m, source, ingress_outcome::REJECTED, took);
            tracing::warn!(%id, source, event, "callback body too large; recorded as rejected");
        } else {
            count(m, source, ingress_outcome::ACCEPTED, took);
            tracing::debug!("callback stored");
        }
    }
}

/// Refused 404: an unknown source or a wrong token. `source` is the configured source
/// whose token was wrong, or `unknown`: never the path's text (arbitrary input).
pub(crate) struct CallbackRefused<'a> {
    pub(crate) source: &'a str,
    pub(crate) peer: Option<std::net::SocketAddr>,
    /// `Some(n)` when this refusal is logged (one line per source a minute): how many
    /// were not since the last line.
    pub(crate) logged: Option<u64>,
    pub(crate) took: Duration,
}

impl InternalEvent for CallbackRefused<'_> {
    const FAMILIES: &'static [&'static str] = FAMILIES;
    fn emit(self, m: &Metrics) {
        count(m, self.source, ingress_outcome::UNAUTHORIZED, self.took);
        if let Some(suppressed) = self.logged {
            tracing::warn!(source = self.source, peer = self.peer.map(tracing::field::display), suppressed,
                "callback refused: unknown source or wrong token (one line per source a minute; `suppressed` counts the others since the last)");
        }
    }
}

/// Why a callback's connection was closed without an answer (the upstream retries;
/// any status would disable its hook).
pub(crate) enum Closed<'a> {
    /// Free space is below the floor (its crossing is logged once, not per callback).
    NoSpace,
    /// The body did not arrive within `ingress.body_timeout`.
    BodyTimeout(Duration),
    /// The body broke off (usually the client went away).
    Incomplete(&'a dyn std::fmt::Display),
}

/// A callback of a known source closed unanswered before it could be stored.
pub(crate) struct CallbackClosed<'a> {
    pub(crate) source: &'a str,
    pub(crate) why: Closed<'a>,
    pub(crate) took: Duration,
}

impl InternalEvent for CallbackClosed<'_> {
    const FAMILIES: &'static [&'static str] = FAMILIES;
    fn emit(self, m: &Metrics) {
        let source = self.source;
        match self.why {
            Closed::NoSpace => count(m, source, ingress_outcome::NO_SPACE, self.took),
            Closed::BodyTimeout(timeout) => {
                count(m, source, ingress_outcome::BODY_TIMEOUT, self.took);
                tracing::warn!(source, ?timeout,
                    "callback body not complete within ingress.body_timeout; connection closed, nothing stored");
            }
            Closed::Incomplete(error) => {
                count(m, source, ingress_outcome::INCOMPLETE, self.took);
                tracing::warn!(source, %error, "callback body incomplete; nothing stored");
            }
        }
    }
}

/// The store failed to take a callback: the connection is closed so the upstream
/// retries.
pub(crate) struct CallbackNotStored<'a> {
    pub(crate) source: &'a str,
    pub(crate) event: &'a str,
    pub(crate) error: &'a dyn std::fmt::Display,
    pub(crate) took: Duration,
}

impl InternalEvent for CallbackNotStored<'_> {
    const FAMILIES: &'static [&'static str] =
        &["hookrelay_ingress_requests_total", "hookrelay_ingress_request_duration_seconds", ERRORS];
    fn emit(self, m: &Metrics) {
        taxonomy::count(m, Stage::Ingress, ErrorType::Storage);
        count(m, self.source, ingress_outcome::STORE_FAILED, self.took);
        tracing::error!(source = self.source, event = self.event, error = %self.error,
            "cannot store callback; closing the connection so the upstream retries");
    }
}
