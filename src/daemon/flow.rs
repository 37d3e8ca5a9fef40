//! The parts of the running relay a reload replaces, and the reload itself: the
//! configuration in force, the destinations and their workers, the dispatch rules, the
//! ingress's gate, the admin tokens, the reconciler and retention.
//!
//! A reload reads the file again and checks it whole (as at start), refuses a change
//! only a restart can make (`config::reload::restart_needed`), builds everything new
//! that can fail, and only then swaps, with no await in between: a reload that fails
//! changes nothing. What was started under the old configuration finishes under it: a
//! changed destination's new worker starts once the old one has recorded its attempts
//! in flight (one worker per destination, ever: never two claiming at once), and the
//! new reconciler once the old one's pass has ended. A removed destination's
//! deliveries stay in the store, held, as at a start without it (`retention.rs`).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use actix_web::web;
use tokio::task::JoinHandle;

use crate::access::journal::{Action, Recorder};
use crate::access::Access;
use crate::admin::reload::Request;
use crate::api::Reloaded;
use crate::config::reload::{changes, fingerprint, restart_needed, Changes};
use crate::config::Config;
use crate::delivery::{Destinations, RelayContext};
use crate::dispatch::DispatchRules;
use crate::ingress::{Gate, IngressState};
use crate::internal_events::{ConfigReloaded, InternalEvent, Reload};
use crate::lock::Current;
use crate::metrics::Metrics;
use crate::shutdown::{Stop, StopTrigger};
use crate::store::SharedStore;
use crate::supervise::Supervisor;
use crate::upstream::Reconciler;

/// Where the configuration comes from, to read it again: the file and the
/// environment the relay was started with.
pub(crate) struct ConfigSource {
    pub(crate) path: PathBuf,
    pub(crate) env: std::collections::HashMap<String, String>,
}

impl ConfigSource {
    /// The configuration as `hookrelay serve` loads it, checked whole.
    async fn load(&self) -> Result<Config, String> {
        let (path, env) = (self.path.clone(), self.env.clone());
        let loaded = tokio::task::spawn_blocking(move || super::load::config(&path, &env)).await;
        match loaded {
            Ok(loaded) => loaded.map_err(|e| e.to_string()),
            Err(e) => Err(format!("reading the configuration failed: {e}")),
        }
    }
}

/// A background part a reload can replace: its own stop, and its (supervised) task.
pub(super) struct Part {
    trigger: StopTrigger,
    task: JoinHandle<()>,
}

impl Part {
    /// Starts `run` (given the part's stop) once `before`, the part it replaces, has
    /// ended, under `sup`. `kind` is the task's metric label, `name` its log name.
    pub(super) fn after<F, Fut>(
        before: Option<Part>,
        sup: &Supervisor,
        kind: &'static str,
        name: String,
        run: F,
    ) -> Part
    where
        F: FnOnce(Stop) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (trigger, stop) = StopTrigger::new();
        let before = before.map(Part::stop);
        let sup = sup.stopped_by(stop.clone());
        let task = tokio::spawn(async move {
            if let Some(before) = before {
                let _ = before.await;
            }
            run(stop).await;
        });
        Part { trigger, task: sup.watch(kind, name, task) }
    }

    /// Tells it to stop; the handle ends once it has.
    pub(super) fn stop(self) -> JoinHandle<()> {
        self.trigger.stop();
        self.task
    }
}

/// What a reload swaps, shared with the listeners, dispatch and the admin API, and the
/// parts it restarts.
pub(super) struct Flow {
    /// The configuration in force.
    pub(super) config: Arc<Config>,
    pub(super) source: Option<ConfigSource>,
    pub(super) store: SharedStore,
    pub(super) metrics: Arc<Metrics>,
    pub(super) destinations: Arc<Current<Destinations>>,
    pub(super) rules: Arc<DispatchRules>,
    pub(super) upstream: Arc<Current<Reconciler>>,
    pub(super) ingress: web::Data<IngressState>,
    pub(super) access: web::Data<Access>,
    pub(super) journal: Arc<Recorder>,
    /// What every delivery worker shares.
    pub(super) relay: Arc<RelayContext>,
    /// The relay's supervisor (each part gets its own stop).
    pub(super) sup: Supervisor,
    pub(super) space: Arc<crate::space::Space>,
    /// One worker per destination, by name.
    pub(super) workers: BTreeMap<String, Part>,
    pub(super) reconciler: Option<Part>,
    pub(super) retention: Option<Part>,
    /// Parts told to stop (removed destinations' workers), until they have.
    pub(super) retiring: Vec<JoinHandle<()>>,
}

impl Flow {
    /// Starts the worker of each destination in force.
    pub(super) fn start_workers(&mut self) {
        let destinations = self.destinations.load();
        for name in destinations.names() {
            let part = self.worker(None, &destinations, name);
            self.workers.insert(name.clone(), part);
        }
    }

    /// The worker of `name` among `destinations`, once `before` has ended.
    fn worker(&self, before: Option<Part>, destinations: &Arc<Destinations>, name: &str) -> Part {
        let (destinations, relay, owned) =
            (destinations.clone(), self.relay.clone(), name.to_owned());
        Part::after(
            before,
            &self.sup,
            "delivery",
            format!("delivery:{name}"),
            move |stop| async move {
                if let Some(worker) = destinations.worker(&owned, &relay, stop) {
                    worker.await;
                }
            },
        )
    }

    /// Starts the reconciler in force, once `before` has ended.
    pub(super) fn start_reconciler(&mut self) {
        let (reconciler, every) = (self.upstream.load(), self.config.upstream.reconcile_interval);
        let before = self.reconciler.take();
        let part = Part::after(before, &self.sup, "reconciler", "reconciler".into(), move |stop| {
            reconciler.run(every, stop)
        });
        self.reconciler = Some(part);
    }

    /// Starts retention on the configuration in force, once `before` has ended.
    pub(super) fn start_retention(&mut self) {
        let (store, metrics, space) =
            (self.store.clone(), self.metrics.clone(), self.space.clone());
        let retention = self.config.retention.clone();
        let keep = self.config.destinations.iter().map(|d| d.name.clone()).collect();
        let before = self.retention.take();
        let part = Part::after(before, &self.sup, "retention", "retention".into(), move |stop| {
            crate::retention::run(store, retention, keep, metrics, space, stop)
        });
        self.retention = Some(part);
    }

    /// Does the reload `request` asks (SIGHUP, or `POST /admin/reload`), journals it,
    /// and answers.
    pub(super) async fn serve(&mut self, request: Request) {
        let Request { by, from, answer } = request;
        let (result, target, count) = match self.reload(&by).await {
            Ok(reloaded) => {
                let count = reloaded.added.len() + reloaded.changed.len() + reloaded.removed.len();
                let target = serde_json::to_value(&reloaded).unwrap_or_default();
                (Ok(reloaded), target, count as u64)
            }
            Err(why) => (Err(why), serde_json::json!({}), 0),
        };
        let journalled = result.as_ref().map(|_| ()).map_err(Clone::clone);
        self.journal.record(&by, from, Action::Reload, target, count, journalled).await;
        let _ = answer.send(result);
    }

    /// Reads the configuration again and puts it in force; `Err` (and nothing changed)
    /// with why when it does not load, or changes what only a restart can.
    async fn reload(&mut self, by: &str) -> Result<Reloaded, String> {
        let Some(source) = &self.source else {
            let why = "this relay was not started from a configuration file: nothing to read again";
            ConfigReloaded { by, result: Reload::Invalid(why) }.emit(&self.metrics);
            return Err(why.into());
        };
        let next = match source.load().await {
            Ok(next) => next,
            Err(why) => {
                ConfigReloaded { by, result: Reload::Invalid(&why) }.emit(&self.metrics);
                return Err(format!("{why}; the running configuration stays"));
            }
        };
        let refused = restart_needed(&self.config, &next);
        if !refused.is_empty() {
            let why: Vec<String> = refused.iter().map(ToString::to_string).collect();
            let why = format!("{}; the running configuration stays", why.join("; "));
            ConfigReloaded { by, result: Reload::Refused(&why) }.emit(&self.metrics);
            return Err(why);
        }
        let changes = changes(&self.config, &next);
        let print = fingerprint(&next);
        if changes.is_empty() && print == fingerprint(&self.config) {
            ConfigReloaded { by, result: Reload::Unchanged }.emit(&self.metrics);
            return Ok(answer("unchanged", &changes, print));
        }
        // Everything new that can fail, before anything is swapped.
        let built = self.build(&next, &changes).await;
        let (destinations, reconciler) = match built {
            Ok(built) => built,
            Err(why) => {
                let why = format!("{why:#}; the running configuration stays");
                ConfigReloaded { by, result: Reload::Invalid(&why) }.emit(&self.metrics);
                return Err(why);
            }
        };
        self.swap(next, &changes, destinations, reconciler);
        ConfigReloaded { by, result: Reload::Reloaded { changes: &changes, fingerprint: print } }
            .emit(&self.metrics);
        Ok(answer("reloaded", &changes, print))
    }

    /// The destinations of `next` (the unchanged ones these very ones) and, when the
    /// sources changed, its reconciler: what can fail, built before the swap.
    async fn build(
        &self,
        next: &Config,
        changes: &Changes,
    ) -> anyhow::Result<(Arc<Destinations>, Option<Arc<Reconciler>>)> {
        let kept: Vec<String> = next
            .destinations
            .iter()
            .map(|d| d.name.clone())
            .filter(|n| !changes.added.contains(n) && !changes.changed.contains(n))
            .collect();
        let destinations = Arc::new(self.destinations.load().next(next, &kept).await?);
        let reconciler = if changes.sources {
            let built = crate::upstream::reconciler(next, self.store.clone(), self.metrics.clone());
            Some(Arc::new(built?))
        } else {
            None
        };
        Ok((destinations, reconciler))
    }

    /// Puts `next` in force, with no await: routes first (nothing new goes to a removed
    /// destination), then the workers, the gate, the tokens, the reconciler, retention.
    fn swap(
        &mut self,
        next: Config,
        changes: &Changes,
        destinations: Arc<Destinations>,
        reconciler: Option<Arc<Reconciler>>,
    ) {
        self.destinations.replace(destinations.clone());
        self.rules.reload(&next, destinations.clone());
        for name in &changes.removed {
            if let Some(part) = self.workers.remove(name) {
                self.retiring.push(part.stop());
            }
            self.metrics.delivery.forget_programs(name);
        }
        for name in changes.added.iter().chain(&changes.changed) {
            let before = self.workers.remove(name);
            let part = self.worker(before, &destinations, name);
            self.workers.insert(name.clone(), part);
            self.metrics.delivery.forget_programs(name);
        }
        self.ingress.gate.replace(Gate::of(&next));
        self.access.reload(&next.admin);
        let (source, wanted) = super::relay::raised(&next);
        self.metrics.operational.want(source, wanted);
        self.config = Arc::new(next);
        if let Some(reconciler) = reconciler {
            self.upstream.replace(reconciler);
            self.start_reconciler();
        }
        // What retention keeps: its settings and the destinations' names (`other`).
        if changes.other {
            self.start_retention();
        }
        self.retiring.retain(|task| !task.is_finished());
    }

    /// Tells every part to stop; their handles in the order to wait for them: the
    /// reconciler first (it talks to the upstream), retention, the delivery workers
    /// last (they finish their attempts).
    pub(super) fn stop(self) -> (Vec<JoinHandle<()>>, Vec<JoinHandle<()>>) {
        let first = self.reconciler.into_iter().map(Part::stop).collect();
        let mut last: Vec<JoinHandle<()>> = self.retention.into_iter().map(Part::stop).collect();
        last.extend(self.workers.into_values().map(Part::stop));
        last.extend(self.retiring);
        (first, last)
    }
}

/// The answer to a reload that took (`result`: reloaded or unchanged).
fn answer(result: &str, changes: &Changes, fingerprint: u64) -> Reloaded {
    Reloaded {
        result: result.into(),
        added: changes.added.clone(),
        changed: changes.changed.clone(),
        removed: changes.removed.clone(),
        sources: changes.sources,
        tokens: changes.tokens,
        fingerprint: format!("{fingerprint:012x}"),
    }
}
