//! The command line's shape, as clap reads it: every command, argument and help text
//! (`hookrelay --help`). What each command does is `mod.rs`'s, `admin.rs`'s and
//! `commands/`'s.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use super::admin;
use crate::config::{LogFormat, DEFAULT_PATH};

/// hookrelay: receives REST-hook callbacks, stores each one durably before answering
/// 200, and relays them to the systems that want them.
#[derive(Parser, Debug)]
#[command(name = "hookrelay", version, propagate_version = true, max_term_width = 100)]
#[command(after_help = "Configuration: a TOML file (see config/hookrelay.toml), overridden by \
    environment variables HOOKRELAY__SECTION__KEY, e.g. HOOKRELAY__STORAGE__DATA_DIR=/var/lib/hookrelay.")]
pub struct Cli {
    /// Log format (overrides log.format of the config).
    #[arg(long, global = true, value_enum, env = "HOOKRELAY_LOG_FORMAT")]
    pub(super) log_format: Option<LogFormat>,

    #[command(subcommand)]
    pub(super) command: Command,
}

#[derive(Subcommand, Debug)]
pub(super) enum Command {
    /// Run the relay: the public callback listener, the admin listener and the store.
    ///
    /// Stops gracefully on SIGTERM or SIGINT: in-flight callbacks are finished and
    /// stored within shutdown.grace, then the store is flushed and the process exits 0.
    Serve(ConfigArg),
    /// Check a configuration and print it as it takes effect, secrets masked.
    ///
    /// Exits 0 when the configuration is valid, 1 (listing every problem) when not.
    CheckConfig(ConfigArg),
    /// Bring the PostgreSQL schema to this build's version, or move an embedded store
    /// to the other engine (--to).
    ///
    /// PostgreSQL: applies the embedded migrations under an advisory lock (relays
    /// starting at the same time migrate once; `serve` does it too); refuses a schema
    /// newer than this build. `--to redb` (or `--to sled`): with the relay stopped,
    /// copies the store in storage.data_dir from storage.backend's engine to the other,
    /// checks the copy entry by entry and moves it into place; then set
    /// storage.backend to it. With --dry-run, says what would be done and changes
    /// nothing.
    Migrate(MigrateArgs),
    /// Print the admin API's OpenAPI 3.1 document (as served at /admin/openapi.json).
    ///
    /// The same document is committed as docs/openapi.json; regenerate it with
    /// `hookrelay openapi > docs/openapi.json` after changing the API.
    Openapi,
    /// Print a reference generated from the code, as committed under docs/.
    ///
    /// `metrics`: every metric family (docs/metrics.md); `config`: every configuration
    /// key with its type, default and meaning (docs/configuration.md). Regenerate them
    /// with `hookrelay reference metrics > docs/metrics.md` (a test fails when stale).
    Reference {
        /// Which reference.
        #[arg(value_enum)]
        what: Reference,
    },
    /// Stored events: list, show, replay (through the admin API).
    Events {
        #[command(flatten)]
        target: admin::Target,
        #[command(subcommand)]
        command: admin::Events,
    },
    /// Dead deliveries: list, replay, delete (through the admin API).
    DeadLetters {
        #[command(flatten)]
        target: admin::Target,
        #[command(subcommand)]
        command: admin::DeadLetters,
    },
    /// Destinations: list, pause, resume (through the admin API).
    Destinations {
        #[command(flatten)]
        target: admin::Target,
        #[command(subcommand)]
        command: admin::Destinations,
    },
    /// Upstream hooks: list, sync (through the admin API).
    Hooks {
        #[command(flatten)]
        target: admin::Target,
        #[command(subcommand)]
        command: admin::Hooks,
    },
    /// Every callback received in a window accounted for (through the admin API):
    /// received = rejected + unrouted + duplicate + routed + waiting per source and
    /// event, and routed = delivered + filtered + superseded + dead + discarded +
    /// pending + retrying + held per destination. Exits 1 when it does not balance.
    #[command(
        after_help = "Examples:\n  hookrelay audit\n  hookrelay audit --since 7d --source demo\n  \
        hookrelay audit --since 2026-06-12T00:00:00Z --until 2026-06-13T00:00:00Z --json"
    )]
    Audit {
        #[command(flatten)]
        target: admin::Target,
        #[command(flatten)]
        window: admin::AuditArgs,
    },
    /// Every change made through the admin API or the console, newest first (through
    /// the admin API): who, when, from where, what, on what, how many, the result.
    #[command(
        after_help = "Examples:\n  hookrelay journal\n  hookrelay journal --since 7d --who crm-team\n  \
        hookrelay journal --action replay --json"
    )]
    Journal {
        #[command(flatten)]
        target: admin::Target,
        #[command(flatten)]
        args: admin::JournalArgs,
    },
    /// Take a backup of the running relay's embedded store (through the admin API; the
    /// admin role), or check one.
    ///
    /// --to FILE: one consistent snapshot of every tree, streamed, checked whole (its
    /// SHA-256), made durable and only then named FILE. --verify FILE: checks a backup
    /// (structure, count, checksum) without a relay; exit 1 when it is damaged. Restore
    /// one with `hookrelay restore`. On PostgreSQL use pg_dump.
    #[command(
        after_help = "Examples:\n  hookrelay backup --to /var/backups/hookrelay-$(date +%F).backup\n  \
        hookrelay backup --verify /var/backups/hookrelay-2026-11-27.backup"
    )]
    Backup {
        #[command(flatten)]
        target: admin::Target,
        /// Save the backup to this file.
        #[arg(
            long,
            value_name = "FILE",
            conflicts_with = "verify",
            required_unless_present = "verify"
        )]
        to: Option<PathBuf>,
        /// Check this backup file (no relay needed).
        #[arg(long, value_name = "FILE")]
        verify: Option<PathBuf>,
    },
    /// Restore a backup into storage.data_dir, which must hold no store (the relay
    /// stopped).
    ///
    /// The file is checked whole first; the store is built beside the data directory's
    /// contents and switched to in one rename, on storage.backend's engine (redb for a
    /// new data directory, whichever engine the backup was taken from). Then start the
    /// relay: it delivers what the backup held as due.
    #[command(
        after_help = "Example:\n  hookrelay restore --from /var/backups/hookrelay-2026-11-27.backup --config /etc/hookrelay/hookrelay.toml"
    )]
    Restore {
        #[command(flatten)]
        config: ConfigArg,
        /// The backup (from `hookrelay backup --to`).
        #[arg(long, value_name = "FILE")]
        from: PathBuf,
    },
    /// Read the configuration file again and put it in force without a restart (through
    /// the admin API, as SIGHUP and `systemctl reload hookrelay` do; the admin role).
    ///
    /// Destinations, routes, filters and transforms, retry, rate and circuit settings,
    /// sources, upstream accounts, retention, admin tokens and roles take at once;
    /// attempts in flight finish under the settings they started with. A file that does
    /// not load, or changes a listener, the storage, logging or telemetry, changes
    /// nothing: the command says why and exits 1.
    #[command(after_help = "Examples:\n  hookrelay reload\n  hookrelay reload --json")]
    Reload {
        #[command(flatten)]
        target: admin::Target,
    },
    /// A simulator of the upstream's REST hooks (and `sim fire` to raise events on it).
    ///
    /// Serves /api/rest/resthooks as the upstream does (bearer tokens per user, paging,
    /// validation, Disabled hooks), calls the hooks' targets when events are raised, and
    /// offers /oauth/token and /sim/... controls. For trying the relay and for its tests.
    Sim(crate::sim::SimArgs),
    /// A shaping process: runs jq programs for the relay that started it, on the
    /// socket it was given as stdin. Not for use by hand.
    #[command(hide = true)]
    ShapeWorker,
}

/// The references `hookrelay reference` prints.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub(super) enum Reference {
    /// Every metric family: docs/metrics.md.
    Metrics,
    /// Every configuration key: docs/configuration.md.
    Config,
}

#[derive(Args, Debug)]
pub(super) struct MigrateArgs {
    #[command(flatten)]
    pub(super) config: ConfigArg,
    /// Show the schema's version and the migrations that would be applied; change nothing.
    #[arg(long)]
    pub(super) dry_run: bool,
    /// Copy the embedded store (storage.backend sled or redb) to this engine, in the
    /// same storage.data_dir.
    #[arg(long, value_name = "ENGINE", value_parser = ["sled", "redb"])]
    pub(super) to: Option<String>,
}

#[derive(Args, Debug)]
pub(super) struct ConfigArg {
    /// Configuration file.
    #[arg(long, short, env = "HOOKRELAY_CONFIG", default_value = DEFAULT_PATH)]
    pub(super) config: PathBuf,
}
