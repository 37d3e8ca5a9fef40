//! Programs run on threads of their own, each run bounded in time, so that a program
//! that never ends cannot hold up dispatch or a destination's deliveries.
//!
//! jaq cannot be interrupted, so a run that outlives [`LIMIT`] is left to its thread,
//! which the pool replaces, and its program is marked **runaway**: from then on it
//! fails at once with that reason (a filter then filters every event out, as an
//! error; a transform makes each delivery dead), until the config is fixed and the
//! relay restarted. Each program can take at most one thread this way. A run that ends
//! within [`GRACE`] after the limit (the relay was frozen, or the machine starved) is
//! not a runaway.
//!
//! The cost is one hand-over to a pool thread per run: callers run every program an
//! event needs in one go.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use super::program::Program;
use crate::lock::lock;

/// How long one run may take.
pub(crate) const LIMIT: Duration = Duration::from_secs(5);
/// How long a run past the limit is still waited for before its program is a runaway.
const GRACE: Duration = Duration::from_millis(200);
/// Threads of the pool (more are started to replace those a runaway keeps).
const THREADS: usize = 2;
/// Their stack: jq recursion is deep.
const STACK_BYTES: usize = 64 << 20;

type Job = Box<dyn FnOnce() + Send>;

/// The program a run is evaluating now, for the blame when it overruns.
#[derive(Clone, Default)]
pub(crate) struct Running(Arc<Mutex<Option<Arc<Program>>>>);

impl Running {
    /// Runs `program` on `input`, noting it as the one running meanwhile.
    pub(crate) fn run(
        &self,
        program: &Arc<Program>,
        input: jaq_json::Val,
    ) -> Result<Vec<jaq_json::Val>, String> {
        *lock(&self.0) = Some(program.clone());
        let out = program.run(input);
        *lock(&self.0) = None;
        out
    }
}

/// The pool of threads programs run on.
pub(crate) struct Evaluator {
    jobs: Mutex<Sender<Job>>,
    queue: Arc<Mutex<Receiver<Job>>>,
    limit: Duration,
}

/// The process's evaluator.
pub(crate) static EVALUATOR: LazyLock<Evaluator> = LazyLock::new(|| Evaluator::new(LIMIT));

impl Evaluator {
    fn new(limit: Duration) -> Self {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        let evaluator = Self { jobs: Mutex::new(jobs), queue, limit };
        for _ in 0..THREADS {
            evaluator.start_thread();
        }
        evaluator
    }

    /// Starts one more thread taking jobs from the queue.
    fn start_thread(&self) {
        let queue = self.queue.clone();
        let started = std::thread::Builder::new()
            .name("hookrelay-jq".into())
            .stack_size(STACK_BYTES)
            .spawn(move || loop {
                let job = match lock(&queue).recv() {
                    Ok(job) => job,
                    Err(_) => return,
                };
                job();
            });
        if let Err(e) = started {
            tracing::error!(error = %e, "cannot start a thread for jq programs; the others go on");
        }
    }

    /// Runs `work` on a pool thread and waits for its answer for the limit; past it
    /// (and the grace), the program `work` was running is marked runaway and the
    /// answer is that error.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Running) -> T + Send + 'static,
    ) -> Result<T, String> {
        let running = Running::default();
        let (reply, answer) = mpsc::sync_channel(1);
        let job_running = running.clone();
        let job: Job = Box::new(move || {
            let _ = reply.send(work(&job_running));
        });
        if lock(&self.jobs).send(job).is_err() {
            return Err("no thread runs jq programs".into());
        }
        match answer.recv_timeout(self.limit) {
            Ok(out) => Ok(out),
            Err(RecvTimeoutError::Timeout) => match answer.recv_timeout(GRACE) {
                Ok(out) => Ok(out),
                Err(_) => Err(self.overrun(&running)),
            },
            Err(RecvTimeoutError::Disconnected) => Err(self.panicked()),
        }
    }

    /// Like [`Evaluator::run`], awaited: the caller's runtime thread is not held.
    pub(crate) async fn run_async<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Running) -> T + Send + 'static,
    ) -> Result<T, String> {
        let running = Running::default();
        let (reply, mut answer) = tokio::sync::oneshot::channel();
        let job_running = running.clone();
        let job: Job = Box::new(move || {
            let _ = reply.send(work(&job_running));
        });
        if lock(&self.jobs).send(job).is_err() {
            return Err("no thread runs jq programs".into());
        }
        match tokio::time::timeout(self.limit, &mut answer).await {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(_)) => Err(self.panicked()),
            Err(_) => match tokio::time::timeout(GRACE, answer).await {
                Ok(Ok(out)) => Ok(out),
                _ => Err(self.overrun(&running)),
            },
        }
    }

    /// A job panicked (its thread is gone): starts another one.
    fn panicked(&self) -> String {
        self.start_thread();
        "the program's run failed (a panic in jq); see the relay's log".into()
    }

    /// A run outlived the limit: blames the program it was running and replaces its
    /// thread.
    fn overrun(&self, running: &Running) -> String {
        self.start_thread();
        let reason = format!(
            "the program ran longer than {}s: it is disabled until the config is fixed and \
             the relay restarted",
            self.limit.as_secs_f64()
        );
        match lock(&running.0).clone() {
            Some(program) => {
                program.mark_runaway(reason.clone());
                tracing::error!(
                    program = program.code(),
                    limit_s = self.limit.as_secs_f64(),
                    "a jq program ran past its limit: disabled; one thread stays busy with it"
                );
            }
            None => tracing::error!("a jq run outlived its limit outside any program"),
        }
        reason
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> jaq_json::Val {
        jaq_json::read::parse_single(b"{\"a\":1}").unwrap()
    }

    /// A run's outputs as text (values stay on the pool's thread).
    fn text(r: &Running, p: &Arc<Program>) -> Result<Vec<String>, String> {
        r.run(p, doc()).map(|v| v.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn a_runaway_program_is_blamed_once_and_the_others_go_on() {
        let evaluator = Evaluator::new(Duration::from_millis(300));
        let forever = Arc::new(Program::compile("last(range(1e18))").unwrap());
        let quick = Arc::new(Program::compile(".a + 1").unwrap());
        let (f, q) = (forever.clone(), quick.clone());
        let err = evaluator.run(move |r| (text(r, &q), text(r, &f))).unwrap_err();
        assert!(err.contains("ran longer than 0.3s"), "{err}");
        // From now on it fails at once, and the pool still runs the others.
        let (f, q) = (forever.clone(), quick.clone());
        let started = std::time::Instant::now();
        let (quick_out, forever_out) = evaluator.run(move |r| (text(r, &q), text(r, &f))).unwrap();
        assert!(started.elapsed() < Duration::from_millis(300));
        assert_eq!(quick_out.unwrap(), ["2"]);
        assert!(forever_out.unwrap_err().contains("ran longer than"));
        for _ in 0..THREADS + 1 {
            let q = quick.clone();
            assert!(evaluator.run(move |r| text(r, &q)).unwrap().is_ok());
        }
    }

    #[test]
    fn deep_recursion_has_room() {
        let p = Arc::new(
            Program::compile("def f: if . < 20000 then (. + 1 | f) else . end; 0 | f").unwrap(),
        );
        let out = EVALUATOR.run(move |r| text(r, &p)).unwrap();
        assert_eq!(out.unwrap(), ["20000"]);
    }
}
