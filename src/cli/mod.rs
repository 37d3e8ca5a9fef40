//! Command line: `hookrelay serve`, `check-config`, the admin commands (`events`,
//! `dead-letters`, `destinations`, `hooks`) that talk to a running relay, and `sim`.

mod admin;
mod args;
mod client;
mod commands;
mod table;

use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;

pub use args::Cli;
use args::{Command, Reference};

use crate::config::LogFormat;

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
