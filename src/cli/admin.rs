//! `hookrelay events|dead-letters|destinations ...`: the admin API from the shell.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::client::{query, AdminClient};
use super::table;
use crate::config::{Config, DEFAULT_PATH};

/// Where the relay's admin API is, and how to print.
#[derive(Args, Debug)]
pub(super) struct Target {
    /// Configuration file of the relay (for admin.listen and admin.token).
    #[arg(long, short, env = "HOOKRELAY_CONFIG", default_value = DEFAULT_PATH, global = true)]
    config: PathBuf,
    /// Admin API base URL, e.g. http://127.0.0.1:9090 (default: from the config).
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
        /// Only events about this record, type/id as in the callback's data
        /// (e.g. actions/5), with where each delivery stands. Served from an index.
        #[arg(long)]
        record: Option<String>,
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
    source: Option<String>,
    /// Only those of events with this name, e.g. ActionCreated.
    #[arg(long)]
    event: Option<String>,
    /// Only those to this destination (its name in the config's [[destinations]]).
    #[arg(long)]
    destination: Option<String>,
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
}

/// `hookrelay hooks ...`
#[derive(Subcommand, Debug)]
pub(super) enum Hooks {
    /// Every upstream account with its hooks, as of the last reconcile.
    List,
    /// Reconcile every account now: create missing hooks, re-create Disabled ones.
    Sync,
}

/// What to run against the admin API.
pub(super) enum Op {
    Events(Events),
    DeadLetters(DeadLetters),
    Destinations(Destinations),
    Hooks(Hooks),
}

/// Runs an admin command; prints its result.
pub(super) async fn run(target: Target, op: Op) -> anyhow::Result<()> {
    let env = std::env::vars().collect();
    // The config is optional when --admin-url and a token are given.
    let config = match Config::load(&target.config, &env) {
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
    let (value, text) = match op {
        Op::Events(cmd) => events(&client, cmd).await?,
        Op::DeadLetters(cmd) => dead_letters(&client, cmd).await?,
        Op::Destinations(cmd) => destinations(&client, cmd).await?,
        Op::Hooks(cmd) => hooks(&client, cmd).await?,
    };
    if target.json {
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{text}");
    }
    // A sync that left an account failing is a failed command (scripts check it).
    let failing =
        value["accounts"].as_array().map_or(0, |a| a.iter().filter(|a| a["ok"] != true).count());
    if sync && failing > 0 {
        anyhow::bail!("{failing} upstream account(s) could not be reconciled (see above)");
    }
    Ok(())
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// One table row per element of the JSON array `v` (none if it is not an array).
fn rows(v: &Value, row: impl Fn(&Value) -> Vec<String>) -> Vec<Vec<String>> {
    v.as_array().map(|a| a.iter().map(row).collect()).unwrap_or_default()
}

fn list(v: &Value) -> String {
    v.as_array().map_or_else(|| "-".into(), |a| a.iter().map(s).collect::<Vec<_>>().join(","))
}

/// `crm=delivered,erp=retrying`, or `-` for none.
fn delivery_states(v: &Value) -> String {
    let states: Vec<String> = v
        .as_array()
        .map(|a| a.iter().map(|d| format!("{}={}", s(&d["destination"]), s(&d["state"]))).collect())
        .unwrap_or_default();
    if states.is_empty() {
        "-".into()
    } else {
        states.join(",")
    }
}

async fn events(client: &AdminClient, cmd: Events) -> anyhow::Result<(Value, String)> {
    match cmd {
        Events::List { source, event, status, record, limit, after } => {
            let by_record = record.is_some();
            let q = query(&[
                ("source", source),
                ("event", event),
                ("status", status),
                ("record", record),
                ("limit", Some(limit.to_string())),
                ("after", after),
            ]);
            let v = client.get(&format!("/admin/events{q}")).await?;
            let rows = rows(&v["events"], |e| {
                let mut row = vec![
                    s(&e["id"]),
                    s(&e["received_at"]),
                    s(&e["source"]),
                    s(&e["event"]),
                    s(&e["status"]),
                    s(&e["size"]),
                    list(&e["flags"]),
                ];
                if by_record {
                    row.push(delivery_states(&e["deliveries"]));
                }
                row
            });
            let mut header = vec!["ID", "RECEIVED", "SOURCE", "EVENT", "STATUS", "SIZE", "FLAGS"];
            if by_record {
                header.push("DELIVERIES");
            }
            let mut text = table::render(&header, &rows);
            if let Some(next) = v["next_after"].as_str() {
                text.push_str(&format!("more: --after {next}\n"));
            }
            Ok((v, text))
        }
        Events::Show { id } => {
            let v = client.get(&format!("/admin/events/{id}")).await?;
            let mut text = format!(
                "event {}  {} from {}  status {}  received {}  {} bytes  flags {}\n",
                s(&v["id"]),
                s(&v["event"]),
                s(&v["source"]),
                s(&v["status"]),
                s(&v["received_at"]),
                s(&v["size"]),
                list(&v["flags"])
            );
            if !v["duplicate_of"].is_null() {
                text.push_str(&format!("duplicate of {}\n", s(&v["duplicate_of"])));
            }
            let rows = rows(&v["deliveries"], |d| {
                vec![
                    s(&d["destination"]),
                    s(&d["state"]),
                    s(&d["total_attempts"]),
                    s(&d["last_status"]),
                    s(&d["last_error"]),
                    s(&d["next_attempt_at"]),
                ]
            });
            text.push_str(&table::render(
                &["DESTINATION", "STATE", "ATTEMPTS", "LAST STATUS", "LAST ERROR", "NEXT ATTEMPT"],
                &rows,
            ));
            text.push_str(&format!("body ({}):\n{}\n", s(&v["body_encoding"]), s(&v["body"])));
            Ok((v, text))
        }
        Events::Replay { id, destinations } => {
            let body = (!destinations.is_empty()).then(|| json!({ "destinations": destinations }));
            let v = client.post(&format!("/admin/events/{id}/replay"), body).await?;
            let text = format!("event {id} replayed to {}\n", list(&v["destinations"]));
            Ok((v, text))
        }
    }
}

async fn dead_letters(client: &AdminClient, cmd: DeadLetters) -> anyhow::Result<(Value, String)> {
    let q = |f: DeadFilter, limit: Option<usize>| {
        query(&[
            ("source", f.source),
            ("event", f.event),
            ("destination", f.destination),
            ("limit", limit.map(|l| l.to_string())),
        ])
    };
    match cmd {
        DeadLetters::List { filter, limit } => {
            let v = client.get(&format!("/admin/dead-letters{}", q(filter, Some(limit)))).await?;
            let rows = rows(&v["dead_letters"], |d| {
                vec![
                    s(&d["event"]),
                    s(&d["destination"]),
                    s(&d["total_attempts"]),
                    s(&d["last_status"]),
                    s(&d["last_error"]),
                ]
            });
            let text = table::render(
                &["EVENT", "DESTINATION", "ATTEMPTS", "LAST STATUS", "LAST ERROR"],
                &rows,
            );
            Ok((v, text))
        }
        DeadLetters::Delete { filter } => {
            let v = client.delete(&format!("/admin/dead-letters{}", q(filter, None))).await?;
            let text = format!("{} dead letters deleted\n", s(&v["deleted"]));
            Ok((v, text))
        }
        DeadLetters::Replay { filter } => {
            let v = client
                .post(&format!("/admin/dead-letters/replay{}", q(filter, None)), None)
                .await?;
            let text = format!("{} dead letters replayed\n", s(&v["replayed"]));
            Ok((v, text))
        }
    }
}

async fn destinations(client: &AdminClient, cmd: Destinations) -> anyhow::Result<(Value, String)> {
    match cmd {
        Destinations::List => {
            let v = client.get("/admin/destinations").await?;
            let rows = rows(&v["destinations"], |d| {
                let q = &d["queue"];
                vec![
                    s(&d["name"]),
                    if d["paused"] == true { "paused".into() } else { "active".into() },
                    s(&d["circuit"]),
                    s(&d["in_flight"]),
                    s(&q["pending"]),
                    s(&q["retrying"]),
                    s(&q["dead"]),
                    d["oldest_age_seconds"].as_f64().map_or("-".into(), |a| format!("{a:.0}s")),
                    s(&d["url"]),
                ]
            });
            let text = table::render(
                &[
                    "NAME",
                    "STATE",
                    "CIRCUIT",
                    "IN FLIGHT",
                    "PENDING",
                    "RETRYING",
                    "DEAD",
                    "OLDEST",
                    "URL",
                ],
                &rows,
            );
            Ok((v, text))
        }
        Destinations::Pause { name } | Destinations::Resume { name } if name.is_empty() => {
            anyhow::bail!("give a destination name")
        }
        Destinations::Pause { name } => {
            let v = client.post(&format!("/admin/destinations/{name}/pause"), None).await?;
            Ok((v, format!("{name} paused\n")))
        }
        Destinations::Resume { name } => {
            let v = client.post(&format!("/admin/destinations/{name}/resume"), None).await?;
            Ok((v, format!("{name} resumed\n")))
        }
    }
}

async fn hooks(client: &AdminClient, cmd: Hooks) -> anyhow::Result<(Value, String)> {
    let v = match cmd {
        Hooks::List => client.get("/admin/hooks").await?,
        Hooks::Sync => client.post("/admin/hooks/sync", None).await?,
    };
    let Some(accounts) = v["accounts"].as_array() else {
        return Ok((v, "no answer\n".into()));
    };
    if accounts.is_empty() {
        return Ok((v.clone(), "no upstream accounts configured\n".into()));
    }
    let mut text = String::new();
    for a in accounts {
        let state = if a["ok"] == true {
            "ok".to_owned()
        } else {
            format!("FAILING: {}", list(&a["errors"]))
        };
        // How old the shown data is, and a warning when no relay reconciles any more.
        let age = match a["age_seconds"].as_u64() {
            Some(secs) if a["stale"] == true => {
                format!(" ({secs}s ago, STALE: no relay has reconciled since)")
            }
            Some(secs) => format!(" ({secs}s ago)"),
            None => String::new(),
        };
        text.push_str(&format!(
            "{}/{}  {}  last reconcile {}{age}  foreign hooks {}\n",
            s(&a["source"]),
            s(&a["account"]),
            state,
            s(&a["last_reconcile"]),
            s(&a["foreign_hooks"])
        ));
        let rows = rows(&a["hooks"], |h| {
            vec![
                s(&h["id"]),
                s(&h["event"]),
                s(&h["status"]),
                s(&h["triggered_count"]),
                s(&h["last_triggered"]),
            ]
        });
        text.push_str(&table::render(
            &["ID", "EVENT", "STATUS", "TRIGGERED", "LAST TRIGGERED"],
            &rows,
        ));
        for c in a["changes"].as_array().into_iter().flatten() {
            text.push_str(&format!(
                "  {} {} -> hook {}\n",
                s(&c["action"]),
                s(&c["event"]),
                s(&c["hook_id"])
            ));
        }
    }
    Ok((v, text))
}
