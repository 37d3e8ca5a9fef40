//! Tokens refused: the console's sign-ins, wrong bearer tokens on `/admin`, and wrong
//! tokens on the pull API.

use std::net::IpAddr;

use super::InternalEvent;
use crate::metrics::Metrics;

/// How a sign-in to the console ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SignIn {
    /// The admin token was right: a session was issued.
    Ok,
    /// A wrong token (counted against its address).
    WrongToken,
    /// Refused unread: too many wrong tokens lately.
    Throttled,
}

/// A sign-in attempt to the console, from `from` (never with what was typed).
pub(crate) struct ConsoleSignIn {
    pub(crate) result: SignIn,
    pub(crate) from: Option<IpAddr>,
}

impl InternalEvent for ConsoleSignIn {
    const FAMILIES: &'static [&'static str] = &["hookrelay_console_sign_ins_total"];
    fn emit(self, m: &Metrics) {
        let label = match self.result {
            SignIn::Ok => "ok",
            SignIn::WrongToken => "wrong_token",
            SignIn::Throttled => "throttled",
        };
        m.relay.console_sign_ins.with_label_values(&[label]).inc();
        let from = self.from.map(|a| a.to_string()).unwrap_or_else(|| "unknown".into());
        match self.result {
            SignIn::Ok => tracing::info!(%from, "console: signed in"),
            SignIn::WrongToken => {
                tracing::warn!(%from, "console: sign-in with a wrong admin token refused")
            }
            SignIn::Throttled => tracing::warn!(%from,
                "console: sign-in refused unread, too many wrong tokens within a minute"),
        }
    }
}

/// A bearer token on `/admin` refused: wrong (counted against its client), or refused
/// unread because its client gave too many wrong ones lately.
pub(crate) struct AdminTokenRefused {
    pub(crate) throttled: bool,
    pub(crate) from: Option<IpAddr>,
}

impl InternalEvent for AdminTokenRefused {
    const FAMILIES: &'static [&'static str] = &["hookrelay_admin_token_refusals_total"];
    fn emit(self, m: &Metrics) {
        let label = if self.throttled { "throttled" } else { "wrong_token" };
        m.relay.admin_token_refusals.with_label_values(&[label]).inc();
        let from = self.from.map(|a| a.to_string()).unwrap_or_else(|| "unknown".into());
        if self.throttled {
            // A flood would be a flood of lines: counted, and logged at debug.
            tracing::debug!(%from, "admin API: refused unread, too many wrong tokens within a minute");
        } else {
            tracing::warn!(%from, "admin API: a wrong bearer token refused");
        }
    }
}

/// A request to the pull API refused before it was read: its token wrong, its
/// destination no pull destination (both counted against its client), or its client
/// throttled.
pub(crate) struct PullTokenRefused {
    pub(crate) result: crate::wrong_tokens::Refused,
    pub(crate) unknown_destination: bool,
    pub(crate) from: Option<IpAddr>,
}

impl InternalEvent for PullTokenRefused {
    const FAMILIES: &'static [&'static str] = &["hookrelay_pull_token_refusals_total"];
    fn emit(self, m: &Metrics) {
        use crate::wrong_tokens::Refused;
        let label = match (self.result, self.unknown_destination) {
            (Refused::Throttled(_), _) => "throttled",
            (Refused::Wrong, true) => "unknown_destination",
            (Refused::Wrong, false) => "wrong_token",
        };
        m.relay.pull_token_refusals.with_label_values(&[label]).inc();
        let from = self.from.map(|a| a.to_string()).unwrap_or_else(|| "unknown".into());
        match label {
            // A flood would be a flood of lines: counted, and logged at debug.
            "throttled" => tracing::debug!(%from,
                "pull API: refused unread, too many wrong tokens within a minute"),
            "unknown_destination" => tracing::warn!(%from,
                "pull API: a request for a destination that is not a pull destination refused"),
            _ => tracing::warn!(%from, "pull API: a wrong token refused"),
        }
    }
}
