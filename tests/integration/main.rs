//! The integration tests: the real binary, real sockets, real sled files, real
//! PostgreSQL servers and third-party checkers, one module per part of the product.
//!
//! One test binary, not one per file: each binary links the whole relay and compiles
//! the harness again, which made linking most of CI's build time. Tests of every
//! module run side by side (as many at once as `cargo test` runs threads), so each
//! test owns its ports, directories, mounts and servers, and its bounds hold with
//! another test running beside it. `cargo test --test integration postgres::` runs one
//! module.

#[path = "../common/mod.rs"]
mod common;

mod audit;
mod backup;
mod brokers;
mod cli;
mod cli_admin;
mod console;
mod delivery;
mod delivery_restart;
mod deploy;
mod disk_full;
mod docs;
mod durability;
mod hostile;
mod http_edges;
mod ingress;
mod journal;
mod layers;
mod liveness;
mod logs;
mod migrate;
mod observability;
mod openapi;
mod operational;
mod postgres;
mod power_loss;
mod prometheus;
mod pull;
mod reload;
mod roles;
mod shape;
mod shutdown;
mod signatures;
mod sim;
mod socket_activation;
mod traces;
mod upstream;
