//! The shaping processes, seen from the relay: where every filter, transform and
//! preview runs, each run bounded on its own.
//!
//! A [`Lane`] keeps a few `hookrelay shape-worker` processes (`worker.rs`) and lends
//! one to a caller for a batch of jobs. Each job is timed from its own send, never
//! counting the wait for a process. A job that outlives [`LIMIT`] has its process
//! killed; a job whose process dies (a stack overflow, memory past [`MEMORY_BYTES`])
//! is answered as crashed. Either way only that run pays: the next job goes to a new
//! process. Dispatch and deliveries share the work lane; previews, which run any
//! program an operator sends, have a lane of their own, so that a looping preview
//! never holds up delivery.
//!
//! The processes belong to their lane: a process idle or lent is killed when dropped
//! (`kill_on_drop`), and one whose relay dies is killed by the kernel
//! (`PR_SET_PDEATHSIG`). [`Shaper::close`] ends them all at shutdown.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::program::Program;
use super::wire::{nonblocking, Answer, Job, WireError};
use crate::lock::lock;

/// How long one run may take, from its own start.
pub(crate) const LIMIT: Duration = Duration::from_secs(2);
/// The memory a shaping process may use for its values: past it an allocation fails
/// and the process ends. Its address space is bounded at this plus [`ADDRESS_SLACK`]
/// (its 256 MiB stack, the binary, the allocator's reservations).
pub(crate) const MEMORY_BYTES: u64 = 1 << 30;
/// Address space a shaping process needs before any value (measured: about 330 MiB
/// mapped, most of it the stack reserved, little of it touched).
const ADDRESS_SLACK: u64 = 512 << 20;
/// Processes of the work lane: one per core of the machines the relay is sized for.
const WORKERS: usize = 2;
/// Processes of the preview lane.
const PREVIEWS: usize = 1;
/// The niceness of a shaping process: a program that runs for its whole limit burns a
/// core, and on a small machine the relay's own threads (answering the upstream,
/// dispatch, delivery) must win that core. Measured (BENCHMARKS.md, runaway): looping
/// previews, filters and transforms beside plain destinations. A run of a few
/// milliseconds is not slowed by it unless the machine is saturated, and then by the
/// relay's own work, which is the point.
const NICE: libc::c_int = 10;
/// How long a preview waits for the preview lane before it is refused.
const PREVIEW_WAIT: Duration = Duration::from_secs(10);
/// How long a dead process is given to be reaped and to finish its last words.
const REAP: Duration = Duration::from_secs(2);
/// Lines a process wrote to stderr kept for the reason of its end.
const LAST_WORDS: usize = 3;

/// How a shaping process is started.
#[derive(Clone, Debug)]
pub(crate) struct Spawn {
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    memory_bytes: u64,
}

impl Spawn {
    /// This very binary (`/proc/self/exe`: the same build even if the file was
    /// replaced by an upgrade since) in its `shape-worker` mode.
    pub(crate) fn relay() -> Self {
        Self {
            program: PathBuf::from("/proc/self/exe"),
            args: vec!["shape-worker".into()],
            env: Vec::new(),
            memory_bytes: MEMORY_BYTES,
        }
    }

    /// The unit-test binary, whose worker is an ignored test (`worker::tests::entry`).
    #[cfg(test)]
    pub(crate) fn unit_tests() -> Self {
        let args = ["shape::worker::tests::entry", "--exact", "--ignored", "--nocapture", "-q"];
        Self {
            program: PathBuf::from("/proc/self/exe"),
            args: args.iter().map(OsString::from).collect(),
            env: vec![(super::worker::tests::ENTRY_ENV.into(), "1".into())],
            memory_bytes: MEMORY_BYTES,
        }
    }

    /// The same, with `memory_bytes` of address space for the heap (tests).
    #[cfg(test)]
    pub(crate) fn with_memory(mut self, memory_bytes: u64) -> Self {
        self.memory_bytes = memory_bytes;
        self
    }

    /// Starts one process on one end of a new socket pair; the other end is returned.
    fn start(&self) -> std::io::Result<Process> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        ours.set_nonblocking(true)?;
        let socket = tokio::net::UnixStream::from_std(ours)?;
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            // The relay's environment holds its tokens: the process needs none of it.
            .env_clear()
            .envs(self.env.iter().cloned())
            .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let memory = self.memory_bytes.saturating_add(ADDRESS_SLACK);
        // SAFETY: between fork and exec only async-signal-safe calls (setrlimit, prctl)
        // on values copied before the fork.
        unsafe {
            command.pre_exec(move || limit_child(memory));
        }
        let mut child = command.spawn()?;
        let said = child.stderr.take().map(|stderr| tokio::spawn(last_words(stderr)));
        Ok(Process { child, socket, said })
    }
}

/// In the child, before exec: its memory bounded, no core file, a lower CPU priority
/// ([`NICE`]), killed with the relay. A sandbox that refuses setrlimit (systemd's
/// `@resources` filter) leaves the child unbounded rather than unstarted: the child
/// says so on stderr (`worker.rs`), which the relay logs.
fn limit_child(memory_bytes: u64) -> std::io::Result<()> {
    let check = |rc: libc::c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    let memory = libc::rlimit { rlim_cur: memory_bytes, rlim_max: memory_bytes };
    let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain system calls on values owned by this stack frame.
    unsafe {
        let _ = libc::setrlimit(libc::RLIMIT_AS, &memory);
        let _ = libc::setrlimit(libc::RLIMIT_CORE, &none);
        let _ = libc::setpriority(libc::PRIO_PROCESS, 0, NICE);
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0))?;
    }
    Ok(())
}

/// Logs what a process writes to stderr, and returns its last lines once it closes.
async fn last_words(stderr: tokio::process::ChildStderr) -> String {
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let mut last = std::collections::VecDeque::new();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim().is_empty() {
            continue;
        }
        tracing::warn!(said = %line, "a shaping process wrote to stderr");
        if last.len() == LAST_WORDS {
            last.pop_front();
        }
        last.push_back(line);
    }
    Vec::from(last).join(" / ")
}

/// One shaping process and the relay's end of its socket.
struct Process {
    child: Child,
    socket: tokio::net::UnixStream,
    /// The task reading its stderr (owned here: it ends when the process does).
    said: Option<JoinHandle<String>>,
}

impl Process {
    /// Sends one job and reads its answer.
    async fn ask(&mut self, job: &Job, body: &[u8]) -> Result<(Answer, Vec<u8>), WireError> {
        nonblocking::write(&mut self.socket, job, body).await?;
        nonblocking::read(&mut self.socket).await
    }

    /// Kills it and waits for it to be gone.
    async fn kill(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(REAP, self.child.wait()).await;
        if let Some(said) = self.said.take() {
            said.abort();
        }
    }

    /// Why it ended (it closed its socket, or broke the protocol): its exit status and
    /// last words, as a reason.
    async fn ended(mut self, error: &WireError) -> String {
        let status = match tokio::time::timeout(REAP, self.child.wait()).await {
            Ok(Ok(status)) => Some(status),
            _ => {
                let _ = self.child.start_kill();
                None
            }
        };
        let words = match self.said.take() {
            Some(said) => tokio::time::timeout(REAP, said).await.ok().and_then(Result::ok),
            None => None,
        }
        .unwrap_or_default();
        describe_end(status, &words, error)
    }
}

/// A reason a user can act on, from how a process ended.
fn describe_end(
    status: Option<std::process::ExitStatus>,
    words: &str,
    error: &WireError,
) -> String {
    use std::os::unix::process::ExitStatusExt;
    let what = if words.contains("overflowed its stack") {
        "recursed too deep (a stack overflow: a recursion without end?)".to_owned()
    } else if words.contains("memory allocation") {
        format!("used more than the {} MiB a run may have", MEMORY_BYTES >> 20)
    } else {
        match status {
            Some(s) if s.signal().is_some() => {
                format!("ended its process (signal {})", s.signal().unwrap_or_default())
            }
            Some(s) => format!("ended its process ({s})"),
            None => format!("broke its process off ({error})"),
        }
    };
    format!("the program {what}: stopped, and the next event is tried again")
}

/// One job for a lane: a program's run on one event, and the program's handle when
/// its strikes count (a configured program; not a preview's).
pub(crate) struct LaneJob {
    pub(crate) job: Job,
    pub(crate) body: bytes::Bytes,
    pub(crate) strikes: Option<std::sync::Arc<Program>>,
}

/// How a run ended.
#[derive(Debug)]
pub(crate) enum Ran {
    /// The process answered.
    Answered(Answer, Vec<u8>),
    /// It was stopped: it ran out of time, or its process died. `disabled` when this
    /// stop was its program's last strike.
    Stopped { cause: Cause, reason: String, disabled: bool },
    /// Not run: its program is disabled, for this reason.
    Disabled(String),
}

/// Why a run was stopped: the internal event's own type, so that the event (below
/// this room) need not import it.
pub(crate) use crate::internal_events::StopCause as Cause;

/// A few shaping processes and the callers they are lent to.
pub(crate) struct Lane {
    spawn: Spawn,
    limit: Duration,
    idle: Mutex<Vec<Process>>,
    slots: Semaphore,
    closed: AtomicBool,
}

impl Lane {
    pub(crate) fn new(spawn: Spawn, limit: Duration, processes: usize) -> Self {
        Self {
            spawn,
            limit,
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(processes),
            closed: AtomicBool::new(false),
        }
    }

    /// Runs `jobs` in order on one process (a new one after each that was stopped),
    /// each within the limit from its own send; waits at most `wait` for a process
    /// (`None`: as long as it takes), else answers `Err` at once. A job's strikes are
    /// kept as it ends, so that a program disabled by one job is not run by the next.
    pub(crate) async fn run(
        &self,
        jobs: Vec<LaneJob>,
        wait: Option<Duration>,
    ) -> Result<Vec<Ran>, String> {
        let permit = match wait {
            None => self.slots.acquire().await.ok(),
            Some(wait) => {
                tokio::time::timeout(wait, self.slots.acquire()).await.ok().and_then(Result::ok)
            }
        };
        let Some(_permit) = permit else {
            return Err(if self.closed.load(Ordering::SeqCst) {
                "the relay is stopping".into()
            } else {
                "every shaping process is busy: try again in a moment".into()
            });
        };
        let mut lent = lock(&self.idle).pop();
        let mut out = Vec::with_capacity(jobs.len());
        for LaneJob { job, body, strikes } in jobs {
            if let Some(why) = strikes.as_deref().and_then(Program::disabled) {
                out.push(Ran::Disabled(why.to_owned()));
                continue;
            }
            let stopped = |cause, reason: String| {
                let disabled = strikes.as_deref().is_some_and(|p| p.strike(&reason));
                Ran::Stopped { cause, reason, disabled }
            };
            let mut process = match lent.take() {
                Some(p) => p,
                None => match self.spawn.start() {
                    Ok(p) => p,
                    Err(e) => {
                        let reason = format!("cannot start a shaping process: {e}");
                        out.push(stopped(Cause::Crashed, reason));
                        continue;
                    }
                },
            };
            match tokio::time::timeout(self.limit, process.ask(&job, &body)).await {
                Ok(Ok((answer, payload))) => {
                    if let Some(program) = &strikes {
                        program.cleared();
                    }
                    out.push(Ran::Answered(answer, payload));
                    lent = Some(process);
                }
                Ok(Err(e)) => {
                    let reason = process.ended(&e).await;
                    out.push(stopped(Cause::Crashed, reason));
                }
                Err(_) => {
                    process.kill().await;
                    let reason = format!(
                        "the program ran longer than {}s: stopped, and the next event is tried again",
                        self.limit.as_secs_f64()
                    );
                    out.push(stopped(Cause::Overran, reason));
                }
            }
        }
        if let Some(process) = lent {
            if self.closed.load(Ordering::SeqCst) {
                process.kill().await;
            } else {
                lock(&self.idle).push(process);
            }
        }
        Ok(out)
    }

    /// Refuses new runs and ends the idle processes (those lent end with their run).
    pub(crate) async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.slots.close();
        let idle = std::mem::take(&mut *lock(&self.idle));
        for process in idle {
            process.kill().await;
        }
    }

    /// Processes alive now, idle (for tests).
    #[cfg(test)]
    pub(crate) fn idle_pids(&self) -> Vec<u32> {
        lock(&self.idle).iter().filter_map(|p| p.child.id()).collect()
    }
}

/// The relay's two lanes: the work lane (dispatch's filters, deliveries' transforms)
/// and the preview lane.
pub(crate) struct Lanes {
    pub(crate) work: Lane,
    pub(crate) preview: Lane,
}

impl Lanes {
    pub(crate) fn new(spawn: Spawn, limit: Duration) -> Self {
        Self {
            work: Lane::new(spawn.clone(), limit, WORKERS),
            preview: Lane::new(spawn, limit, PREVIEWS),
        }
    }

    /// How long a preview waits for its lane.
    pub(crate) const PREVIEW_WAIT: Duration = PREVIEW_WAIT;
}
