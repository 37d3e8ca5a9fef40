//! Where the embedded store's calls run (the blocking pool, or the thread that asked),
//! and its close letting go of the database.

use std::sync::Arc;
use std::thread::{self, ThreadId};

use super::super::engine::Engine;
use super::super::testutil;
use super::*;

/// Where a read and a write of `store` ran.
async fn where_calls_run(store: &EmbeddedStore) -> (ThreadId, ThreadId) {
    let read = store.run(|_| Ok(thread::current().id())).await.unwrap();
    let write = store.write(|_| Ok(thread::current().id())).await.unwrap();
    (read, write)
}

/// A call its caller gave up on still runs on the blocking pool, holding the
/// database: the close waits for it, so that the file is free once the store is
/// dropped. Seen in the daemon's start-and-stop test as "in use by another
/// process" when a relay was started again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn the_close_waits_for_calls_given_up_on_and_the_file_is_free_after() {
    let dir = tempfile::tempdir().unwrap();
    let store = testutil::open_on(Engine::Redb, dir.path());
    let (began, running) = std::sync::mpsc::channel();
    let mut slow = Box::pin(store.run(move |_| {
        let _ = began.send(());
        thread::sleep(Duration::from_millis(400));
        Ok(())
    }));
    tokio::select! {
        _ = &mut slow => panic!("the slow call ended before it was given up on"),
        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
    }
    running.recv_timeout(Duration::from_secs(5)).expect("the slow call began");
    drop(slow);
    store.close().await.expect("close");
    drop(store);
    let again = EmbeddedStore::open(&testutil::options(Engine::Redb, dir.path()));
    assert!(again.is_ok(), "opened again at once: {:?}", again.err());
}

/// A thread that asked runs the calls itself, reads and writes alike, and a
/// failed store still refuses its writes; every other thread's calls go to the
/// blocking pool (a runtime thread never does the disk's work).
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_thread_that_asked_runs_the_calls_itself() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(testutil::open_on(Engine::Redb, dir.path()));
    let runtime_thread = thread::current().id();
    let (read, write) = where_calls_run(&store).await;
    assert_ne!(read, runtime_thread);
    assert_ne!(write, runtime_thread);

    let (runtime, asked) = (tokio::runtime::Handle::current(), store.clone());
    let (own, (read, write), refused) = thread::spawn(move || {
        run_calls_here();
        runtime.block_on(async {
            let ran = where_calls_run(&asked).await;
            asked.inner.health.fail("a test failed it".to_owned());
            let refused = asked.write(|_| Ok(())).await;
            (thread::current().id(), ran, refused)
        })
    })
    .join()
    .unwrap();
    assert_eq!((read, write), (own, own));
    assert!(matches!(refused, Err(StoreError::Failed(_))), "{refused:?}");
    // The runtime's threads were not told: their calls still go to the pool.
    assert_ne!(store.run(|_| Ok(thread::current().id())).await.unwrap(), runtime_thread);
}
