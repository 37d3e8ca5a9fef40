//! Command line: `hookrelay serve`, `check-config`, the admin commands (`events`,
//! `dead-letters`, `destinations`, `hooks`) that talk to a running relay, and `sim`.

mod admin;
mod client;
mod commands;
mod table;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

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
    log_format: Option<LogFormat>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
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
enum Reference {
    /// Every metric family: docs/metrics.md.
    Metrics,
    /// Every configuration key: docs/configuration.md.
    Config,
}

#[derive(Args, Debug)]
struct MigrateArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Show the schema's version and the migrations that would be applied; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Copy the embedded store (storage.backend sled or redb) to this engine, in the
    /// same storage.data_dir.
    #[arg(long, value_name = "ENGINE", value_parser = ["sled", "redb"])]
    to: Option<String>,
}

#[derive(Args, Debug)]
struct ConfigArg {
    /// Configuration file.
    #[arg(long, short, env = "HOOKRELAY_CONFIG", default_value = DEFAULT_PATH)]
    config: PathBuf,
}

/// Parses the command line and runs the command; returns the process exit code.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_) | Command::Sim(_)) {
        // A command whose output goes to `head` ends quietly when the pipe closes, as
        // Unix tools do, instead of panicking on the write. (The servers keep Rust's
        // default: a closed socket is an error to handle, not a signal.)
        // SAFETY: restoring the default disposition of one signal, before any thread.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let env: HashMap<String, String> = std::env::vars().collect();
    match cli.command {
        Command::CheckConfig(args) => check_config(&args.config, &env),
        Command::Serve(args) => serve(&args.config, cli.log_format, &env),
        Command::Migrate(args) => migrate(&args.config.config, args.dry_run, args.to, &env),
        Command::Reference { what } => {
            let text = match what {
                Reference::Metrics => match crate::metrics::Metrics::new() {
                    Ok(m) => m.reference(),
                    Err(e) => {
                        eprintln!("hookrelay: cannot build the metrics registry: {e}");
                        return ExitCode::FAILURE;
                    }
                },
                Reference::Config => crate::config::reference(),
            };
            print!("{text}");
            ExitCode::SUCCESS
        }
        Command::Openapi => {
            print!("{}", crate::api::openapi::pretty());
            ExitCode::SUCCESS
        }
        Command::Events { target, command } => run_admin(target, admin::Op::Events(command)),
        Command::DeadLetters { target, command } => {
            run_admin(target, admin::Op::DeadLetters(command))
        }
        Command::Destinations { target, command } => {
            run_admin(target, admin::Op::Destinations(command))
        }
        Command::Hooks { target, command } => run_admin(target, admin::Op::Hooks(command)),
        Command::Audit { target, window } => run_admin(target, admin::Op::Audit(window)),
        Command::Journal { target, args } => run_admin(target, admin::Op::Journal(args)),
        Command::Reload { target } => run_admin(target, admin::Op::Reload),
        Command::Backup { target, to, verify } => {
            run_admin(target, admin::Op::Backup { to, verify })
        }
        Command::Restore { config, from } => restore(&config.config, &from, &env),
        Command::Sim(args) => sim(args, cli.log_format),
        Command::ShapeWorker => crate::shape::worker::main(),
    }
}

fn check_config(path: &Path, env: &HashMap<String, String>) -> ExitCode {
    match crate::daemon::load::config(path, env) {
        Ok(config) => {
            println!("# {} is valid; effective configuration, secrets masked:", path.display());
            print!("{}", config.to_masked_toml());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hookrelay: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(path: &Path, log_format: Option<LogFormat>, env: &HashMap<String, String>) -> ExitCode {
    let config = match crate::daemon::load::config(path, env) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("hookrelay: {e}");
            return ExitCode::FAILURE;
        }
    };
    crate::telemetry::init(&config.log.level, log_format.unwrap_or(config.log.format));
    if !crate::allocator::refuse_transparent_huge_pages() {
        tracing::debug!(error = %std::io::Error::last_os_error(),
            "the kernel did not take PR_SET_THP_DISABLE: memory may be held in huge pages");
    }
    if crate::allocator::returns_freed_memory_at_once(&config.storage) {
        crate::allocator::return_freed_memory_at_once();
    }
    // The listeners systemd holds across restarts, if it started the relay that way.
    let sockets = match crate::activation::take(env) {
        Ok(sockets) => sockets,
        Err(e) => {
            tracing::error!(error = %e, "cannot take the sockets handed over");
            eprintln!("hookrelay: {e}");
            return ExitCode::FAILURE;
        }
    };
    let source = crate::daemon::ConfigSource { path: path.to_owned(), env: env.clone() };
    let launch = crate::daemon::Launch { source: Some(source), sockets };
    block_on(true, "hookrelay", crate::daemon::serve(config, launch))
}

fn migrate(
    path: &Path,
    dry_run: bool,
    to: Option<String>,
    env: &HashMap<String, String>,
) -> ExitCode {
    let to = match to.map(crate::config::StorageBackend::try_from).transpose() {
        Ok(to) => to,
        Err(e) => {
            eprintln!("hookrelay: --to: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The database settings only: migrating needs no token nor secret.
    let config = match crate::daemon::load::storage(path, env) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("hookrelay: {e}");
            return ExitCode::FAILURE;
        }
    };
    block_on(false, "hookrelay migrate", async move {
        let report = crate::store::migrate(&config.storage, dry_run, to).await?;
        println!("{report}");
        Ok(())
    })
}

fn restore(path: &Path, from: &Path, env: &HashMap<String, String>) -> ExitCode {
    // The storage settings only: a restore needs no token nor secret.
    let config = match crate::daemon::load::storage(path, env) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("hookrelay: {e}");
            return ExitCode::FAILURE;
        }
    };
    block_on(false, "hookrelay restore", async move {
        println!("{}", crate::store::restore(&config.storage, from).await?);
        Ok(())
    })
}

fn sim(args: crate::sim::SimArgs, log_format: Option<LogFormat>) -> ExitCode {
    if args.command.is_none() {
        crate::telemetry::init("info", log_format.unwrap_or(LogFormat::Text));
    }
    block_on(true, "hookrelay sim", crate::sim::run(args))
}

fn run_admin(target: admin::Target, op: admin::Op) -> ExitCode {
    block_on(false, "hookrelay", admin::run(target, op))
}

/// Runs `task` on a new runtime (multi-threaded for the servers); errors are printed
/// as `{name}: {error}` and give exit code 1.
fn block_on(
    multi_thread: bool,
    name: &str,
    task: impl std::future::Future<Output = anyhow::Result<()>>,
) -> ExitCode {
    let mut builder = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(task);
    // A blocking call stuck in a failed disk must not keep the process alive.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Once, where the logs go: a server's log line (text or JSON, as configured),
            // or, for a command that logs nothing, a line of its own.
            if tracing::dispatcher::has_been_set() {
                tracing::error!(error = format!("{e:#}"), "{name} stopped on an error");
            } else {
                eprintln!("{name}: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every command and every argument says what it is in `--help`.
    #[test]
    fn every_command_and_argument_has_a_description() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} <{id}>"));
                }
            }
            for sub in cmd.get_subcommands() {
                let name = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() && sub.get_long_about().is_none() {
                    missing.push(name.clone());
                }
                walk(sub, &name, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "hookrelay", &mut missing);
        assert!(missing.is_empty(), "no description in --help: {missing:#?}");
    }
}
