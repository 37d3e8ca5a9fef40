//! The shaping processes against the programs and bodies that once stopped the relay:
//! loops, recursions without end, memory without bound, bodies nested 200,000 deep.
//! Each must cost only its own run, leave no process behind, and the next run must be
//! answered.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pool::{Cause, Lane, LaneJob, Ran, Spawn};
use super::program::Program;
use super::wire::{Answer, Role};
use super::*;
use crate::store::FilteredOut;

/// A lane of one unit-test process, runs bounded at `limit`.
fn lane(limit: Duration) -> Lane {
    Lane::new(Spawn::unit_tests().with_memory(256 << 20), limit, 1)
}

fn meta() -> EventMeta {
    crate::store::fixtures::received("demo", "ActionCreated", 1_763_000_000_000_000, "{}").meta
}

fn job_of(role: Role, code: &str, body: impl Into<bytes::Bytes>) -> LaneJob {
    let job = job(role, &Program::compile(code).unwrap(), EventId::new(9), &meta());
    LaneJob { job, body: body.into(), strikes: None }
}

const BODY: &[u8] = br#"{"data":{"type":"actions","id":"5"}}"#;

fn alive(pid: u32) -> bool {
    // A zombie is gone for every purpose but its entry: read its state.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.split(") ").nth(1).is_some_and(|rest| rest.starts_with('Z')))
}

#[tokio::test]
async fn a_loop_costs_its_own_run_and_its_process_is_killed() {
    let lane = lane(Duration::from_millis(500));
    // A first run starts the process.
    let ran = lane
        .run(vec![job_of(Role::Filter, ".event == \"ActionCreated\"", BODY)], None)
        .await
        .unwrap();
    assert!(matches!(ran[..], [Ran::Answered(Answer::Matched, _)]), "{ran:?}");
    let first = lane.idle_pids();
    assert_eq!(first.len(), 1);
    // At a lower CPU priority than the relay: a loop yields the core to its threads.
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", first[0])).unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    assert_eq!(fields[16], "10", "niceness of the shaping process: {stat}");
    let started = Instant::now();
    let jobs = vec![
        job_of(Role::Filter, "last(range(1e18)) | true", BODY),
        job_of(Role::Transform, "{id: .body.data.id}", BODY),
    ];
    let ran = lane.run(jobs, None).await.unwrap();
    match &ran[..] {
        [Ran::Stopped { cause: Cause::Overran, reason, .. }, Ran::Answered(Answer::Transformed, body)] =>
        {
            assert!(reason.contains("ran longer than 0.5s"), "{reason}");
            assert_eq!(body, br#"{"id":"5"}"#);
        }
        other => panic!("{other:?}"),
    }
    // Timed from its own start: one limit, not the batch's.
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    assert!(!alive(first[0]), "the runaway's process {} is gone", first[0]);
    let now = lane.idle_pids();
    assert_eq!(now.len(), 1, "one process again, a new one");
    assert_ne!(now, first);
    lane.close().await;
    assert!(!alive(now[0]), "close ends the idle process");
}

#[tokio::test]
async fn a_recursion_without_end_and_memory_without_bound_end_their_process_only() {
    let lane = lane(Duration::from_secs(20));
    let jobs = vec![
        job_of(Role::Filter, "def f: [f]; f", BODY),
        // A string doubled until it passes the memory bound: a few copies of memory,
        // quick even at the shaping processes' low priority on a busy machine.
        job_of(Role::Transform, "\"x\" | until(length > 4e9; . + .) | length", BODY),
        job_of(
            Role::Filter,
            "def f: if . < 20000 then (. + 1 | f) else . end; 0 | f == 20000",
            BODY,
        ),
    ];
    let ran = lane.run(jobs, None).await.unwrap();
    match &ran[..] {
        [Ran::Stopped { cause: Cause::Crashed, reason: deep, .. }, Ran::Stopped { cause: Cause::Crashed, reason: big, .. }, Ran::Answered(Answer::Matched, _)] =>
        {
            assert!(deep.contains("recursed too deep"), "{deep}");
            assert!(big.contains("used more than"), "{big}");
        }
        other => panic!("{other:?}"),
    }
    lane.close().await;
}

#[tokio::test]
async fn a_body_nested_200_000_deep_is_null_to_the_program_with_the_reason() {
    let lane = lane(Duration::from_secs(20));
    let deep = format!("{{\"data\":{}{}}}", "[".repeat(200_000), "]".repeat(200_000));
    let jobs = vec![
        job_of(Role::Filter, ".event == \"Other\"", deep.clone()),
        job_of(Role::Transform, "{event, body}", deep),
    ];
    let ran = lane.run(jobs, None).await.unwrap();
    match &ran[..] {
        [Ran::Answered(Answer::Filtered { reason, error: false }, _), Ran::Answered(Answer::Transformed, body)] =>
        {
            assert!(reason.contains("nests deeper than 127 levels"), "{reason}");
            assert_eq!(body, br#"{"event":"ActionCreated","body":null}"#);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(lane.idle_pids().len(), 1, "the same process answered both");
    lane.close().await;
}

#[tokio::test]
async fn a_program_stopped_three_times_within_an_hour_is_disabled_good_runs_between_or_not() {
    let metrics = Arc::new(crate::metrics::Metrics::new().unwrap());
    let shaper = Shaper::with(Spawn::unit_tests(), Duration::from_millis(300), metrics.clone());
    // Loops only on events of resource actions/1.
    let filter = Arc::new(
        Program::compile("if .resource == \"actions/1\" then last(range(1e18)) else true end")
            .unwrap(),
    );
    let event = |resource: &str| {
        let mut meta = meta();
        meta.resource = Some(resource.into());
        ToFilter {
            id: EventId::new(1),
            meta,
            body: BODY.into(),
            filters: vec![("crm".into(), filter.clone())],
        }
    };
    let reasons = |out: Vec<Vec<FilteredOut>>| -> Vec<String> {
        out.into_iter().map(|f| f.first().map_or("matched".into(), |f| f.reason.clone())).collect()
    };
    // Loops, a good run, loops: two stopped runs, still run.
    let out = reasons(
        shaper.filtered_out(["actions/1", "actions/2", "actions/1"].map(event).to_vec()).await,
    );
    assert!(out[0].contains("ran longer") && out[2].contains("ran longer"), "{out:?}");
    assert_eq!(out[1], "matched", "{out:?}");
    assert!(filter.disabled().is_none());
    // A good run, then a loop: the third stopped run within the hour, good runs between
    // or not (a caller interleaving bodies that loop with ordinary ones).
    let started = Instant::now();
    let out = reasons(
        shaper
            .filtered_out(["actions/2", "actions/1", "actions/2", "actions/1"].map(event).to_vec())
            .await,
    );
    assert_eq!(out[0], "matched", "{out:?}");
    assert!(out[1].contains("ran longer"), "the third within the hour: {out:?}");
    assert!(filter.disabled().is_some());
    // From then on never run, in the same batch too: one limit, not two.
    assert!(out[2].starts_with("disabled after 3 runs within an hour that"), "{out:?}");
    assert!(out[3].starts_with("disabled after 3 runs within an hour that"), "{out:?}");
    assert!(started.elapsed() < Duration::from_millis(1200), "{:?}", started.elapsed());
    let text = metrics.render();
    assert!(text.contains("hookrelay_shape_runs_stopped_total{cause=\"overran\",destination=\"crm\",program=\"filter\"} 3"), "{}", text.lines().filter(|l| l.contains("shape")).collect::<Vec<_>>().join("\n"));
    assert!(
        text.contains("hookrelay_shape_program_disabled{destination=\"crm\",program=\"filter\"} 1")
    );
    shaper.close().await;
}

#[tokio::test]
async fn a_looping_preview_never_holds_up_the_work_lane() {
    let metrics = Arc::new(crate::metrics::Metrics::new().unwrap());
    let shaper = Arc::new(Shaper::with(Spawn::unit_tests(), Duration::from_secs(3), metrics));
    let looping = Arc::new(Program::compile("def f: f; f").unwrap());
    let preview = {
        let (shaper, looping) = (shaper.clone(), looping.clone());
        tokio::spawn(async move {
            let body = bytes::Bytes::from_static(BODY);
            shaper.preview("crm", Some(&looping), None, EventId::new(1), &meta(), &body).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let transform = Arc::new(Program::compile("{event}").unwrap());
    let started = Instant::now();
    let body = bytes::Bytes::from_static(BODY);
    let sent = shaper.body_sent("crm", Some(&transform), EventId::new(2), &meta(), &body).await;
    assert_eq!(sent.unwrap().0, &br#"{"event":"ActionCreated"}"#[..]);
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    let (verdict, _) = preview.await.unwrap();
    assert!(
        matches!(&verdict, FilterVerdict::Filtered { reason, error: true } if reason.contains("ran longer")),
        "{verdict:?}"
    );
    assert!(looping.disabled().is_none(), "a preview strikes nothing");
    shaper.close().await;
}
