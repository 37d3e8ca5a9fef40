//! `hookrelay serve`: the relay as an assembly of owned parts. [`run`] reads as its
//! table of contents: the base (metrics, readiness, free space), the store, the relay
//! started on it ([`relay::Relay`]: every component, built and started in order),
//! the wait for a reason to stop, and the stop of every part in order, the store
//! closed last, all within `shutdown.grace`.

mod base;
mod flow;
mod listeners;
pub(crate) mod load;
mod open;
mod relay;

use anyhow::Context;

use crate::config::Config;
use crate::shutdown::{Stop, StopTrigger};
use base::Base;
pub(crate) use flow::ConfigSource;
use open::open_store;
use relay::Relay;

/// Runs the relay until SIGTERM or SIGINT, then drains: readiness goes false, the
/// ingress finishes in-flight callbacks, the background tasks end, the store commits
/// and flushes. Returns once everything is on disk.
pub(crate) async fn serve(config: Config, launch: Launch) -> anyhow::Result<()> {
    let signals = crate::shutdown::signals().context("installing signal handlers")?;
    // SIGHUP's default is to end the process: taken over first, so that a reload asked
    // while the relay starts (it may wait minutes for its database) is not its end. The
    // relay reads SIGHUP once it runs (`Relay::wait`); one before is ignored.
    let early = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler (reload)")?;
    drop(early);
    let (trigger, requested) = StopTrigger::new();
    let run = run(config, launch, requested);
    tokio::pin!(run);
    tokio::select! {
        result = &mut run => return result,
        signal = signals => trigger.stop_for(signal),
    }
    run.await
}

/// The relay until `requested` (a signal, in `serve`; a test's trigger), then stopped
/// and every part of it joined.
pub(crate) async fn run(config: Config, launch: Launch, mut requested: Stop) -> anyhow::Result<()> {
    let base = Base::new(&config)?;
    let opened = open_store(
        &config,
        base.commits.clone(),
        &base.metrics,
        &base.location,
        &base.space,
        launch.sockets.admin.as_ref(),
        &mut requested,
    )
    .await?;
    let Some(store) = opened else { return Ok(()) };
    open::announce(&config, &store, &base).await;
    let mut relay = Relay::start(&config, launch, &base, store).await?;
    let ended = relay.wait(&mut requested).await;
    let durable = config.storage.durability == crate::config::Durability::Durable;
    relay.stop(ended, config.shutdown.grace, durable).await
}

/// How the relay was started, beyond its configuration: where a reload reads it again
/// (none: a reload is refused), and the listeners the service manager handed over
/// (none: it binds its own).
#[derive(Default)]
pub(crate) struct Launch {
    pub(crate) source: Option<ConfigSource>,
    pub(crate) sockets: crate::activation::Sockets,
}

#[cfg(test)]
mod tests;
