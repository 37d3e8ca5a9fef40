//! `hookrelay events|dead-letters|destinations ...`: the admin API from the shell.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::client::AdminClient;
use super::commands::{
    audit, backup_to, dead_letters, destinations, events, hooks, journal, reload, typed, verify,
};
use crate::api;
use crate::config::{Config, DEFAULT_PATH};

/// Where the relay's admin API is, and how to print.
#[derive(Args, Debug)]
pub(super) struct Target {
    /// Configuration file of the relay (for admin.listen and admin.token; only the
    /// [admin] section is needed). Default: config/hookrelay.toml, or
    /// /etc/hookrelay/hookrelay.toml where that one is missing and this one is there (a
    /// production host, as deploy/systemd installs it).
    #[arg(long, short, env = "HOOKRELAY_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Admin API base URL, e.g. http://127.0.0.1:8079 (default: from the config).
    #[arg(long, env = "HOOKRELAY_ADMIN_URL", global = true)]
    admin_url: Option<String>,
    /// Admin token (default: from the config). Prefer the environment variable: a
    /// command line is visible to other users.
    #[arg(long, env = "HOOKRELAY_ADMIN_TOKEN", hide_env_values = true, global = true)]
    admin_token: Option<String>,
    /// Print the admin API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

/// `hookrelay events ...`
#[derive(Subcommand, Debug)]
pub(super) enum Events {
    /// List stored events, newest first.
    List {
        /// Only events of this source (its name in the config's [[sources]]).
        #[arg(long)]
        source: Option<String>,
        /// Only events with this name, e.g. ActionCreated.
        #[arg(long)]
        event: Option<String>,
        /// received, dispatched, duplicate, unrouted or rejected.
        #[arg(long)]
        status: Option<String>,
        /// Only events about this resource, type/id as in the callback's data
        /// (e.g. actions/5), with where each delivery stands. Served from an index.
        /// (`--record` is its name of the first builds, still accepted.)
        #[arg(long, visible_alias = "record", value_name = "TYPE/ID")]
        resource: Option<String>,
        /// At most this many (1 to the admin API's maximum).
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Continue after this event id (the previous page's last).
        #[arg(long)]
        after: Option<String>,
    },
    /// Show one event: headers, body, dedup outcome, deliveries and attempts.
    Show {
        /// The event's id, as `events list` or the callback's answer gives it.
        id: String,
    },
    /// Deliver an event again (to the destinations it was routed to, or the named ones).
    Replay {
        /// The event's id, as `events list` or the callback's answer gives it.
        id: String,
        /// A destination to replay to (repeatable).
        #[arg(long = "destination")]
        destinations: Vec<String>,
    },
}

/// `hookrelay dead-letters ...`
#[derive(Subcommand, Debug)]
pub(super) enum DeadLetters {
    /// List dead deliveries with their last status and error.
    List {
        #[command(flatten)]
        filter: DeadFilter,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Replay every dead delivery matching the filters.
    Replay {
        #[command(flatten)]
        filter: DeadFilter,
    },
    /// Delete every dead delivery matching the filters (it is never retried).
    Delete {
        #[command(flatten)]
        filter: DeadFilter,
    },
}

/// Which dead deliveries: all of them unless filtered.
#[derive(Args, Debug)]
pub(super) struct DeadFilter {
    /// Only those of events of this source.
    #[arg(long)]
    pub(super) source: Option<String>,
    /// Only those of events with this name, e.g. ActionCreated.
    #[arg(long)]
    pub(super) event: Option<String>,
    /// Only those to this destination (its name in the config's [[destinations]]).
    #[arg(long)]
    pub(super) destination: Option<String>,
}

/// `hookrelay destinations ...`
#[derive(Subcommand, Debug)]
pub(super) enum Destinations {
    /// Every destination: paused, circuit, queue.
    List,
    /// Hold a destination's deliveries (nothing is dropped; on every relay sharing the store).
    Pause {
        /// The destination's name in the config's [[destinations]].
        name: String,
    },
    /// Release a paused destination.
    Resume {
        /// The destination's name in the config's [[destinations]].
        name: String,
    },
    /// What a destination would make of a stored event: its filter's verdict and the
    /// body its transform gives. Nothing is written or sent. Try a jq program before
    /// it is in the config with --filter or --transform.
    #[command(
        after_help = "Examples:\n  hookrelay destinations preview --destination crm --event 000661032a1b2c3d\n  \
        hookrelay destinations preview --destination crm --event 000661032a1b2c3d \\\n    \
        --filter '.body.data.attributes.status == \"Open\"' --transform '{event, id: .body.data.id}'"
    )]
    Preview {
        /// The destination's name in the config's [[destinations]].
        #[arg(long)]
        destination: String,
        /// A stored event's id (`hookrelay events list` shows them).
        #[arg(long)]
        event: String,
        /// A jq filter to try instead of the destination's (`""`: none).
        #[arg(long)]
        filter: Option<String>,
        /// A jq transform to try instead of the destination's (`""`: none).
        #[arg(long)]
        transform: Option<String>,
    },
}

/// `hookrelay hooks ...`
#[derive(Subcommand, Debug)]
pub(super) enum Hooks {
    /// Every upstream account with its hooks, as of the last reconcile.
    List,
    /// Reconcile every account now: create missing hooks, re-create Disabled ones.
    Sync,
}

/// `hookrelay audit`: which window of receive time, and which source.
#[derive(Args, Debug)]
pub(super) struct AuditArgs {
    /// Start of the window: a time (RFC 3339, e.g. 2026-06-12T00:00:00Z) or how long
    /// ago (e.g. 6h, 7d). Default: a day before --until.
    #[arg(long)]
    pub(super) since: Option<String>,
    /// End of the window: a time or how long ago. Default: now.
    #[arg(long)]
    pub(super) until: Option<String>,
    /// Only this source's events (destinations are counted over every source).
    #[arg(long)]
    pub(super) source: Option<String>,
}

/// `hookrelay journal`: which changes.
#[derive(Args, Debug)]
pub(super) struct JournalArgs {
    /// Only changes at or after this: a time (RFC 3339) or how long ago (e.g. 7d).
    #[arg(long)]
    pub(super) since: Option<String>,
    /// Only changes before this: a time or how long ago.
    #[arg(long)]
    pub(super) until: Option<String>,
    /// Only this admin token's changes (its name; `admin` for admin.token).
    #[arg(long)]
    pub(super) who: Option<String>,
    /// Only this kind: replay, discard, pause, resume, hook_sync, reload, sign_in,
    /// sign_out, sign_in_failed.
    #[arg(long)]
    pub(super) action: Option<String>,
    /// How many, newest first (1 to 1000).
    #[arg(long, default_value_t = 50)]
    pub(super) limit: usize,
}

/// What to run against the admin API.
pub(super) enum Op {
    Journal(JournalArgs),
    Reload,
    /// A backup saved to this file (`--to`), or a file checked (`--verify`, offline).
    Backup {
        to: Option<PathBuf>,
        verify: Option<PathBuf>,
    },
    Events(Events),
    DeadLetters(DeadLetters),
    Destinations(Destinations),
    Hooks(Hooks),
    Audit(AuditArgs),
}

/// Where a production host keeps the relay's configuration (deploy/systemd installs it).
const SYSTEM_PATH: &str = "/etc/hookrelay/hookrelay.toml";

/// The configuration an admin command reads: the one given, else `config/hookrelay.toml`
/// of this directory, else (when that one is missing) the system's, if it `exists`.
fn config_path(given: Option<PathBuf>, exists: impl Fn(&std::path::Path) -> bool) -> PathBuf {
    given.unwrap_or_else(|| {
        let local = PathBuf::from(DEFAULT_PATH);
        let system = PathBuf::from(SYSTEM_PATH);
        if !exists(&local) && exists(&system) {
            system
        } else {
            local
        }
    })
}

/// Runs an admin command; prints its result.
pub(super) async fn run(target: Target, op: Op) -> anyhow::Result<()> {
    // A file checked needs no relay.
    if let Op::Backup { verify: Some(path), .. } = &op {
        let (value, text) = verify(path)?;
        return print(&target, &value, &text);
    }
    let env = std::env::vars().collect();
    // The config is optional when --admin-url and a token are given.
    let path = config_path(target.config.clone(), |p| p.exists());
    let config = match Config::load(&path, &env) {
        Ok(c) => Some(c),
        Err(e) if target.admin_url.is_some() => {
            tracing::debug!(error = %e, "config not used");
            None
        }
        Err(e) => return Err(e).context("reading the config (or give --admin-url)"),
    };
    let client =
        AdminClient::new(config.as_ref(), target.admin_url.clone(), target.admin_token.clone())?;
    let sync = matches!(op, Op::Hooks(Hooks::Sync));
    let is_audit = matches!(op, Op::Audit(_));
    let (value, text) = match op {
        Op::Events(cmd) => events(&client, cmd).await?,
        Op::DeadLetters(cmd) => dead_letters(&client, cmd).await?,
        Op::Destinations(cmd) => destinations(&client, cmd).await?,
        Op::Hooks(cmd) => hooks(&client, cmd).await?,
        Op::Audit(args) => audit(&client, args).await?,
        Op::Journal(args) => journal(&client, args).await?,
        Op::Reload => reload(&client).await?,
        Op::Backup { to, .. } => {
            let to = to.context("give --to FILE (or --verify FILE)")?;
            backup_to(&client, &to).await?
        }
    };
    print(&target, &value, &text)?;
    // A sync that left an account failing is a failed command (scripts check it).
    if sync {
        let accounts: api::Accounts = typed(&value)?;
        let failing = accounts.accounts.iter().filter(|a| !a.ok).count();
        if failing > 0 {
            anyhow::bail!("{failing} upstream account(s) could not be reconciled (see above)");
        }
    }
    // An audit that does not balance is a failed command (a cron job notices).
    if is_audit {
        let report: api::AuditReport = typed(&value)?;
        if !report.balanced {
            anyhow::bail!(
                "the audit does not balance ({} equation(s)): see above, and the runbook's HookrelayAuditImbalance",
                report.imbalances.len()
            );
        }
    }
    Ok(())
}

/// Prints a command's result: the API's JSON with `--json`, else its text.
fn print(target: &Target, value: &serde_json::Value, text: &str) -> anyhow::Result<()> {
    if target.json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{text}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one given wins; else this directory's; else, on a host where only the
    /// system's exists, the system's.
    #[test]
    fn the_config_is_found_where_a_production_host_keeps_it() {
        let given = PathBuf::from("/srv/relay.toml");
        assert_eq!(config_path(Some(given.clone()), |_| true), given);
        assert_eq!(config_path(None, |_| true), PathBuf::from(DEFAULT_PATH));
        let only_system = |p: &std::path::Path| p == std::path::Path::new(SYSTEM_PATH);
        assert_eq!(config_path(None, only_system), PathBuf::from(SYSTEM_PATH));
        assert_eq!(config_path(None, |_| false), PathBuf::from(DEFAULT_PATH), "named in the error");
    }
}
