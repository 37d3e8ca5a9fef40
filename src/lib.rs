//! hookrelay: a durable relay for REST-hook callbacks.
//!
//! The modules follow the data flow: `ingress` (callbacks in) → `store` (sled, group
//! commit) → dispatch and delivery (to come), with `admin`, `metrics` and `config`
//! beside them. See ARCHITECTURE.md.

mod admin;
mod cli;
mod config;
mod daemon;
mod event_names;
mod ingress;
mod metrics;
mod shutdown;
mod store;
mod telemetry;

pub use cli::run;
