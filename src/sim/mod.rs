//! `hookrelay sim`: a simulator of the upstream's REST hooks, faithful to
//! `upstream-api.md` and to the real service's habits (`upstream-notes.md`), so that the
//! relay can be tried and tested without the real service.
//!
//! `api` serves `/api/rest/resthooks`; `hooks` holds them (ownership, validation,
//! paging); `fire` raises events and calls the hooks' targets; `control` is the
//! simulator's own `/sim/...` interface and the OAuth2 token endpoint.

mod api;
mod control;
mod error;
mod fire;
mod hooks;
mod state;
mod users;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use actix_web::{web, App, HttpServer};
use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;

use state::{SimConfig, SimState, UserConfig};

/// `hookrelay sim [OPTIONS]` serves; `hookrelay sim fire` raises events on a running one.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct SimArgs {
    #[command(subcommand)]
    pub(crate) command: Option<SimCommand>,
    #[command(flatten)]
    pub(crate) serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
pub(crate) enum SimCommand {
    /// Raise an event on a running simulator: every Active hook for it is called.
    ///
    /// Prints the calls made (hook, user, delivered / disabled / failed) as JSON.
    Fire(FireArgs),
    /// Disable hooks on a running simulator, as the upstream does when their target
    /// does not answer 200: the relay then re-creates them and reports the gap.
    #[command(after_help = "Examples:\n  hookrelay sim disable --event ActionCreated\n  \
        hookrelay sim disable --hook 3\n  hookrelay sim disable --event TaskCreated --user alice")]
    Disable(DisableArgs),
    /// Make the simulator's sink (`/sim/sink`, a consumer to deliver to) fail for a
    /// while: the relay retries, and delivers once it is back.
    #[command(after_help = "Example:\n  hookrelay sim outage --seconds 60 --status 503")]
    Outage(OutageArgs),
}

/// `hookrelay sim disable`.
#[derive(Args, Debug)]
pub(crate) struct DisableArgs {
    /// Base URL of the simulator.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// One hook, by id (`GET /sim/hooks` lists them).
    #[arg(long, required_unless_present = "event")]
    hook: Option<String>,
    /// Every Active hook of this event.
    #[arg(long)]
    event: Option<String>,
    /// Only this user's hooks.
    #[arg(long)]
    user: Option<String>,
}

/// `hookrelay sim outage`.
#[derive(Args, Debug)]
pub(crate) struct OutageArgs {
    /// Base URL of the simulator.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// How long the sink fails (0 ends an outage).
    #[arg(long)]
    seconds: u64,
    /// The status it answers meanwhile (400 to 599).
    #[arg(long, default_value_t = 503)]
    status: u16,
}

/// Options of the simulator server. The flags add to (or override) `--config`.
#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// Simulator config (TOML): listen, [[users]] with token and/or refresh_token,
    /// [oauth] client, quirks, throttle_every, callback_timeout, callback_retries.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8000].
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// A user and its static bearer token, as NAME:TOKEN (repeatable).
    #[arg(long = "user", value_name = "NAME:TOKEN")]
    users: Vec<String>,
    /// Switch on a real-world quirk of the upstream (repeatable).
    #[arg(long = "quirk", value_enum)]
    quirks: Vec<Quirk>,
    /// Answer every N-th API request with 429 and Retry-After (see throttle_retry_after).
    #[arg(long, value_name = "N")]
    throttle_every: Option<u32>,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Quirk {
    /// A collection with exactly one record is an object, not an array.
    SingleObject,
    /// `triggeredLastTimestamp` (null when never) instead of `lastTriggered`.
    TriggeredLastTimestamp,
}

#[derive(Args, Debug)]
pub(crate) struct FireArgs {
    /// Base URL of the simulator.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// Event name, e.g. ActionCreated.
    #[arg(long)]
    event: String,
    /// The record's id (`data.id`); generated when absent.
    #[arg(long)]
    id: Option<String>,
    /// The record's attributes, as a JSON object.
    #[arg(long, value_name = "JSON")]
    attributes: Option<String>,
    /// Raise this many occurrences, one after the other.
    #[arg(long, conflicts_with = "rate")]
    count: Option<u64>,
    /// Raise this many occurrences per second (in the background; needs --duration).
    #[arg(long, requires = "duration")]
    rate: Option<f64>,
    /// How long to keep raising at --rate, e.g. 30s.
    #[arg(long, requires = "rate", value_parser = crate::config::duration::parse)]
    duration: Option<Duration>,
}

/// Runs `hookrelay sim ...`.
pub(crate) async fn run(args: SimArgs) -> anyhow::Result<()> {
    match args.command {
        Some(SimCommand::Fire(fire)) => fire_command(fire).await,
        Some(SimCommand::Disable(a)) => {
            let body = json!({ "id": a.hook, "event": a.event, "user": a.user });
            control_command(&a.url, "/sim/hooks/disable", body).await
        }
        Some(SimCommand::Outage(a)) => {
            let body = json!({ "seconds": a.seconds, "status": a.status });
            control_command(&a.url, "/sim/sink-outage", body).await
        }
        None => serve(args.serve).await,
    }
}

fn effective_config(args: ServeArgs) -> anyhow::Result<SimConfig> {
    let mut config = match &args.config {
        Some(path) => SimConfig::load(path)?,
        None => SimConfig::default(),
    };
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    for spec in &args.users {
        let (name, token) = spec
            .split_once(':')
            .filter(|(n, t)| !n.is_empty() && !t.is_empty())
            .with_context(|| "--user takes NAME:TOKEN".to_owned())?;
        config.users.push(UserConfig {
            name: name.to_owned(),
            token: Some(token.to_owned()),
            refresh_token: None,
        });
    }
    for quirk in args.quirks {
        match quirk {
            Quirk::SingleObject => config.quirks.single_object = true,
            Quirk::TriggeredLastTimestamp => config.quirks.triggered_last_timestamp = true,
        }
    }
    if let Some(n) = args.throttle_every {
        config.throttle_every = n;
    }
    if config.users.is_empty() {
        anyhow::bail!("no users: give --user NAME:TOKEN or [[users]] in --config");
    }
    Ok(config)
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let config = effective_config(args)?;
    let listen = config.listen;
    let users: Vec<String> = config.users.iter().map(|u| u.name.clone()).collect();
    let state = web::Data::new(SimState::new(config)?);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .app_data(web::JsonConfig::default().limit(1 << 20))
            .configure(api::routes)
            .configure(control::routes)
    })
    .workers(2)
    .disable_signals()
    .bind(listen)
    .map_err(|e| crate::bind::error(e, "--listen (or listen in the sim's config)", listen))?;
    for addr in server.addrs() {
        tracing::info!(listener = "sim", %addr, ?users, "listening");
    }
    let server = server.run();
    let handle = server.handle();
    let task = tokio::spawn(server);
    let reason = crate::shutdown::signal().await.context("installing signal handlers")?;
    tracing::info!(%reason, "simulator stopping");
    handle.stop(true).await;
    let _ = task.await;
    Ok(())
}

/// Posts `body` to a control of the simulator at `base`; prints its answer.
async fn control_command(base: &str, path: &str, body: serde_json::Value) -> anyhow::Result<()> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let response =
        reqwest::Client::new().post(&url).json(&body).send().await.with_context(|| {
            format!("cannot reach the simulator at {url} (is `hookrelay sim` running? --url)")
        })?;
    let status = response.status();
    let text = response.text().await.context("reading the simulator's answer")?;
    if !status.is_success() {
        anyhow::bail!("the simulator answered {status}: {text}");
    }
    println!("{}", text.trim_end());
    Ok(())
}

async fn fire_command(args: FireArgs) -> anyhow::Result<()> {
    let attributes = match &args.attributes {
        Some(text) => Some(
            serde_json::from_str::<serde_json::Value>(text)
                .context("--attributes must be a JSON object")?,
        ),
        None => None,
    };
    let body = json!({
        "event": args.event,
        "id": args.id,
        "attributes": attributes,
        "count": args.count,
        "rate": args.rate,
        "duration": args.duration.map(|d| humantime::format_duration(d).to_string()),
    });
    let url = format!("{}/sim/events", args.url.trim_end_matches('/'));
    let response = reqwest::Client::new()
        .post(&url)
        .json(&body)
        .send()
        .await
        .with_context(|| format!("cannot reach the simulator at {url}"))?;
    let status = response.status();
    let text = response.text().await.context("reading the simulator's answer")?;
    if !status.is_success() {
        anyhow::bail!("the simulator answered {status}: {text}");
    }
    let pretty = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or(text);
    println!("{pretty}");
    Ok(())
}
