//! The [`Shaper`]: where dispatch, deliveries and the admin API have programs run (the
//! shaping processes of `pool.rs`), and what a stopped run costs its program.

use std::sync::Arc;
use std::time::Duration;

use super::pool::{self, LaneJob, Lanes, Ran, Spawn};
use super::program::Program;
use super::wire::{self, Answer, Job, Role};
use super::{job, FilterVerdict, Sent, ToFilter, ToTransform};
use crate::internal_events::{InternalEvent, ShapeRunStopped};
use crate::metrics::Metrics;
use crate::store::{EventId, EventMeta, FilteredOut};

/// Where every program runs: the relay's shaping processes (`pool.rs`), and what a
/// stopped run costs its program (strikes, then disabled). Owned by the daemon; ended
/// by [`Shaper::close`].
pub(crate) struct Shaper {
    lanes: Lanes,
    metrics: Arc<Metrics>,
}

/// A run's answer and payload, or why there is none.
type Answered = Result<(Answer, Vec<u8>), String>;

/// One program to run on one event, for `destination`.
struct Task {
    destination: String,
    program: Arc<Program>,
    job: Job,
    body: bytes::Bytes,
}

impl Shaper {
    /// The relay's shaper: this binary's `shape-worker` processes, [`pool::LIMIT`] a run.
    pub(crate) fn new(metrics: Arc<Metrics>) -> Self {
        Self::with(Spawn::relay(), pool::LIMIT, metrics)
    }

    /// A shaper whose processes are started by `spawn`, each run bounded by `limit`.
    pub(crate) fn with(spawn: Spawn, limit: Duration, metrics: Arc<Metrics>) -> Self {
        Self { lanes: Lanes::new(spawn, limit), metrics }
    }

    /// Ends every process; a run asked after this fails at once.
    pub(crate) async fn close(&self) {
        self.lanes.work.close().await;
        self.lanes.preview.close().await;
    }

    /// Runs `tasks` on the work lane: each answer, or why there is none. A disabled
    /// program is not run; a stopped run strikes its program (`Program::strike`).
    async fn run(&self, tasks: Vec<Task>) -> Vec<Answered> {
        let mut out: Vec<Option<Answered>> = Vec::with_capacity(tasks.len());
        let mut sent = Vec::new();
        let mut jobs = Vec::new();
        for (i, task) in tasks.iter().enumerate() {
            if let Some(why) = too_large(&task.body) {
                out.push(Some(Err(why)));
            } else {
                out.push(None);
                sent.push(i);
                let strikes = Some(task.program.clone());
                jobs.push(LaneJob { job: task.job.clone(), body: task.body.clone(), strikes });
            }
        }
        if !jobs.is_empty() {
            match self.lanes.work.run(jobs, None).await {
                Ok(ran) => {
                    for (i, ran) in sent.into_iter().zip(ran) {
                        let task = &tasks[i];
                        out[i] = Some(self.judged(&task.destination, task.job.role.as_str(), ran));
                    }
                }
                Err(why) => {
                    for i in sent {
                        out[i] = Some(Err(why.clone()));
                    }
                }
            }
        }
        out.into_iter().map(|o| o.unwrap_or_else(|| Err("not run".into()))).collect()
    }

    /// A run's answer; a stop is told (`ShapeRunStopped`).
    fn judged(&self, destination: &str, role: &str, ran: Ran) -> Answered {
        match ran {
            Ran::Answered(answer, payload) => Ok((answer, payload)),
            Ran::Disabled(why) => Err(why),
            Ran::Stopped { cause, reason, disabled } => {
                ShapeRunStopped { destination, role, cause, reason: &reason, disabled }
                    .emit(&self.metrics);
                Err(reason)
            }
        }
    }

    /// For each event, the destinations whose filter does not match it, and why.
    pub(crate) async fn filtered_out(&self, batch: Vec<ToFilter>) -> Vec<Vec<FilteredOut>> {
        let mut tasks = Vec::new();
        let mut shape = Vec::with_capacity(batch.len());
        for e in batch {
            shape.push(e.filters.len());
            for (destination, program) in e.filters {
                let job = job(Role::Filter, &program, e.id, &e.meta);
                tasks.push(Task { destination, program, job, body: e.body.clone() });
            }
        }
        let destinations: Vec<String> = tasks.iter().map(|t| t.destination.clone()).collect();
        let mut answers = self.run(tasks).await.into_iter().zip(destinations);
        shape
            .into_iter()
            .map(|n| {
                answers
                    .by_ref()
                    .take(n)
                    .filter_map(|(answer, destination)| match filter_answer(answer) {
                        FilterVerdict::Matched => None,
                        FilterVerdict::Filtered { reason, error } => {
                            Some(FilteredOut { destination, reason, error })
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// What `transform` of `destination` makes of each event, by claim token.
    pub(crate) async fn bodies_sent(
        &self,
        destination: &str,
        transform: &Arc<Program>,
        events: Vec<ToTransform>,
    ) -> Vec<(u64, Result<Sent, String>)> {
        let tokens: Vec<u64> = events.iter().map(|e| e.token).collect();
        let tasks = events
            .into_iter()
            .map(|e| Task {
                destination: destination.to_owned(),
                program: transform.clone(),
                job: job(Role::Transform, transform, e.id, &e.meta),
                body: e.body,
            })
            .collect();
        tokens.into_iter().zip(self.run(tasks).await.into_iter().map(transform_answer)).collect()
    }

    /// What is sent for event `id`: its body as received, or what `transform` makes of
    /// it (JSON, whatever the callback's content type was).
    pub(crate) async fn body_sent(
        &self,
        destination: &str,
        transform: Option<&Arc<Program>>,
        id: EventId,
        meta: &EventMeta,
        body: &bytes::Bytes,
    ) -> Result<Sent, String> {
        let Some(program) = transform else {
            return Ok((body.clone(), meta.content_type.clone()));
        };
        let event = ToTransform { token: 0, id, meta: meta.clone(), body: body.clone() };
        let mut made = self.bodies_sent(destination, program, vec![event]).await;
        made.pop().map_or_else(|| Err("not run".into()), |(_, sent)| sent)
    }

    /// A preview: the filter's verdict and the body sent, on the preview lane (any
    /// program an operator sends; a stopped one strikes nothing configured).
    pub(crate) async fn preview(
        &self,
        destination: &str,
        filter: Option<&Arc<Program>>,
        transform: Option<&Arc<Program>>,
        id: EventId,
        meta: &EventMeta,
        body: &bytes::Bytes,
    ) -> (FilterVerdict, Result<Sent, String>) {
        if let Some(why) = too_large(body) {
            let verdict = filter.map_or(FilterVerdict::Matched, |_| FilterVerdict::Filtered {
                reason: why.clone(),
                error: true,
            });
            return (verdict, transform.map_or_else(|| Ok(as_received(meta, body)), |_| Err(why)));
        }
        let jobs: Vec<LaneJob> = [(Role::Filter, filter), (Role::Transform, transform)]
            .into_iter()
            .filter_map(|(role, p)| {
                Some(LaneJob { job: job(role, p?, id, meta), body: body.clone(), strikes: None })
            })
            .collect();
        let roles: Vec<Role> = jobs.iter().map(|j| j.job.role).collect();
        let ran = self.lanes.preview.run(jobs, Some(Lanes::PREVIEW_WAIT)).await;
        let mut answers: Vec<(Role, Answered)> = match ran {
            Ok(ran) => roles
                .into_iter()
                .zip(ran)
                .map(|(role, ran)| (role, self.judged(destination, "preview", ran)))
                .collect(),
            Err(why) => roles.into_iter().map(|role| (role, Err(why.clone()))).collect(),
        };
        let transformed = match answers.pop() {
            Some((Role::Transform, answer)) => transform_answer(answer),
            other => {
                answers.extend(other);
                Ok(as_received(meta, body))
            }
        };
        let verdict = match answers.pop() {
            Some((Role::Filter, answer)) => filter_answer(answer),
            _ => FilterVerdict::Matched,
        };
        (verdict, transformed)
    }
}

/// Why a body cannot be shaped at all: larger than a shaping process takes.
fn too_large(body: &[u8]) -> Option<String> {
    (body.len() > wire::MAX_PAYLOAD).then(|| {
        format!(
            "the body is {} bytes, more than the {} MiB a program is given",
            body.len(),
            wire::MAX_PAYLOAD >> 20
        )
    })
}

/// The body sent when there is no transform.
fn as_received(meta: &EventMeta, body: &bytes::Bytes) -> Sent {
    (body.clone(), meta.content_type.clone())
}

/// A filter's verdict from its run's answer.
fn filter_answer(answer: Answered) -> FilterVerdict {
    match answer {
        Ok((Answer::Matched, _)) => FilterVerdict::Matched,
        Ok((Answer::Filtered { reason, error }, _)) => FilterVerdict::Filtered { reason, error },
        Ok((Answer::Transformed | Answer::Failed { .. }, _)) => FilterVerdict::Filtered {
            reason: "the shaping process answered a filter as a transform".into(),
            error: true,
        },
        Err(reason) => FilterVerdict::Filtered { reason, error: true },
    }
}

/// A transform's body from its run's answer.
fn transform_answer(answer: Answered) -> Result<Sent, String> {
    match answer {
        Ok((Answer::Transformed, body)) => Ok((body.into(), Some("application/json".to_owned()))),
        Ok((Answer::Failed { reason }, _)) => Err(reason),
        Ok((Answer::Matched | Answer::Filtered { .. }, _)) => {
            Err("the shaping process answered a transform as a filter".into())
        }
        Err(reason) => Err(reason),
    }
}
