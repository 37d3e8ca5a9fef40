//! hookrelay: a durable relay for REST-hook callbacks.
//!
//! The modules follow the data flow: `ingress` (callbacks in) → `store` (group commit;
//! redb for a new data directory, sled where one was left, PostgreSQL for a fleet) →
//! `dispatch` (dedup, route) → `delivery` (schedules, retries) → `destinations` (HTTP
//! out), with `admin`, `console`, `metrics` and `config` beside them. Each imports only
//! rooms of a lower layer: ARCHITECTURE.md declares them and a test holds the code to it.

mod access;
mod account;
mod activation;
mod admin;
mod allocator;
mod api;
mod audit;
mod bind;
mod cli;
mod clock;
mod config;
mod console;
mod daemon;
mod delivery;
mod destinations;
mod dispatch;
mod event_names;
mod fleet;
mod ingress;
mod internal_events;
mod lock;
mod metrics;
mod notify;
mod operational;
mod pull;
mod reachability;
mod readiness;
mod retention;
mod shape;
mod shutdown;
mod sim;
mod space;
mod store;
mod supervise;
mod telemetry;
mod template;
mod timefmt;
mod upstream;
mod wrong_tokens;

pub use cli::run;
