//! A transaction whose `BEGIN` and `COMMIT` cost no round trip of their own.
//!
//! Why: tokio-postgres's `Transaction` waits for `BEGIN`'s answer before the first
//! statement goes, and for the last statement's answer before `COMMIT` goes. Two of
//! a dispatch's five round trips, and two of an attempt record's four, carried no
//! work, and on a loaded machine each round trip waits for PostgreSQL's backend and
//! then the relay's connection task to be scheduled (issue 44; BENCHMARKS.md says
//! what it changed). Here `BEGIN` is sent when the transaction opens, ahead of
//! whatever statement comes first. `COMMIT` is sent right behind the last statements
//! ([`Tx::commit_with`]).
//!
//! Invariants (each has a test below):
//! 1. `BEGIN` goes before any statement of the transaction. [`Tx::begin`] sends it
//!    before it returns: tokio-postgres sends a request when its future is first
//!    polled, and runs requests in the order sent (its crate documentation).
//! 2. `COMMIT` goes only after every statement of the transaction was sent:
//!    [`Tx::commit_with`] prepares its statements before it sends any of them, then
//!    polls them before `COMMIT`.
//! 3. A transaction that ends without its commit is rolled back before its
//!    connection serves anything else: an error, a `?`, or the caller's future
//!    dropped at an `await` (`Drop` sends `ROLLBACK`, ahead of whatever the pool's
//!    next user sends).
//! 4. A failed statement is what [`Tx::commit_with`] reports. PostgreSQL answers
//!    the `COMMIT` of a failed transaction by rolling it back, without an error, so
//!    its answer alone would hide the failure.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use futures_util::FutureExt;
use tokio_postgres::types::ToSql;

use super::cached::{prepare_all, run_prepared};
use super::pg;
use crate::lock::lock;
use crate::store::StoreError;

/// The answer to `BEGIN`, read when the transaction ends.
type Answer<'a> = Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send + 'a>>;

/// An open transaction on a pooled connection. Statements run on it through
/// `Deref` (it is the connection, with `BEGIN` sent); it ends by
/// [`Tx::commit_with`], [`Tx::rollback`] or, rolled back, when dropped.
pub(super) struct Tx<'a> {
    client: &'a pg::Client,
    /// `BEGIN`'s answer, still to be read (a `Mutex` so that `&Tx` is `Send`: it
    /// is touched only when the transaction ends).
    begun: Mutex<Option<Answer<'a>>>,
    /// Whether `COMMIT` or `ROLLBACK` is still to be sent.
    open: bool,
}

impl<'a> Tx<'a> {
    /// Opens a transaction on `client`: `BEGIN` is sent now, its answer read when
    /// the transaction ends. An error only if the connection is closed.
    pub(super) fn begin(client: &'a pg::Client) -> Result<Self, StoreError> {
        let mut begun: Answer<'a> = Box::pin(client.batch_execute("BEGIN"));
        // The first poll sends it (invariant 1). It may already bring the answer:
        // a failure to send, or the server's when this thread was slow between the
        // send and the read (a logger at debug level, a preemption: seen in the
        // tests). A future is not polled again once it answered.
        let begun = match (&mut begun).now_or_never() {
            None => Some(begun),
            Some(Ok(())) => None,
            Some(Err(e)) => return Err(e.into()),
        };
        Ok(Self { client, begun: Mutex::new(begun), open: true })
    }

    /// Runs `last` (statements and their parameters, in this order) and commits,
    /// all in one round trip; the rows of each statement.
    pub(super) async fn commit_with(
        mut self,
        last: &[(&str, Vec<&(dyn ToSql + Sync)>)],
    ) -> Result<Vec<Vec<pg::Row>>, StoreError> {
        let prepared = prepare_all(self.client, last).await?;
        let begun = lock(&self.begun).take();
        let client = self.client;
        // Polled in this order by `try_join!`: the statements are sent, then
        // `COMMIT` (invariant 2). The first error in that order is reported
        // (invariant 4).
        let statements = async { run_prepared(client, &prepared, last).await };
        // Whether `COMMIT` went: not when a statement failed before it was polled (its
        // parameters could not be encoded). Once it went, a `ROLLBACK` would only earn
        // a warning in the server's log ("there is no transaction in progress").
        let sent = std::sync::atomic::AtomicBool::new(false);
        let commit = async {
            sent.store(true, std::sync::atomic::Ordering::Relaxed);
            client.batch_execute("COMMIT").await
        };
        let begun = async {
            match begun {
                Some(answer) => answer.await,
                None => Ok(()),
            }
        };
        let done = tokio::try_join!(statements, commit, begun);
        self.open = !sent.load(std::sync::atomic::Ordering::Relaxed);
        let (rows, (), ()) = done?;
        Ok(rows)
    }

    /// Rolls back, once PostgreSQL has done so (the rows it locked are free when
    /// this returns).
    pub(super) async fn rollback(mut self) -> Result<(), StoreError> {
        self.open = false;
        self.client.batch_execute("ROLLBACK").await?;
        Ok(())
    }
}

impl std::ops::Deref for Tx<'_> {
    type Target = pg::Client;

    fn deref(&self) -> &pg::Client {
        self.client
    }
}

impl Drop for Tx<'_> {
    /// Sends `ROLLBACK` if neither `COMMIT` nor `ROLLBACK` was (invariant 3); its
    /// answer is not waited for. After a `COMMIT` sent but not answered (the
    /// caller's future dropped meanwhile) it is a no-op for PostgreSQL.
    fn drop(&mut self) {
        if self.open {
            // The first poll sends it; the answer is let go.
            let _ = self.client.batch_execute("ROLLBACK").now_or_never();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Tx;
    use crate::store::postgres::tests::two_relays;
    use crate::store::postgres::{pg, PostgresStore};

    /// A store on a database of its own, and one of its connections on which `ddl`
    /// (table `t`) was run.
    async fn table(name: &'static str, ddl: &str) -> (PostgresStore, pg::Client) {
        let (a, _b) = two_relays(name).await;
        let client = a.client().await.unwrap();
        client.batch_execute(ddl).await.unwrap();
        (a, client)
    }

    /// `t`'s rows as `client` sees them.
    async fn count(client: &pg::Client) -> i64 {
        client.query_one("SELECT count(*) FROM t", &[]).await.unwrap().get(0)
    }

    /// `t`'s rows on another connection of `store`.
    async fn committed(store: &PostgresStore) -> i64 {
        count(&store.client().await.unwrap()).await
    }

    /// Statements sent right after `begin` are inside the transaction (invariant 1):
    /// dropped uncommitted, their rows are gone, and the connection is usable, out of
    /// any transaction (invariant 3).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_transaction_is_rolled_back_before_the_connection_serves_again() {
        let (a, client) = table("tx_drop", "CREATE TABLE t (a integer)").await;
        {
            let tx = Tx::begin(&client).unwrap();
            tx.execute("INSERT INTO t VALUES (1)", &[]).await.unwrap();
        }
        assert_eq!(count(&client).await, 0);
        // Out of any transaction: a statement's effect is seen by another connection.
        client.execute("INSERT INTO t VALUES (2)", &[]).await.unwrap();
        assert_eq!(committed(&a).await, 1);
    }

    /// A transaction whose caller's future is dropped at an `await` (a timeout) is
    /// rolled back too, and its row locks are freed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transaction_cancelled_at_an_await_is_rolled_back() {
        let (a, client) =
            table("tx_cancel", "CREATE TABLE t (a integer); INSERT INTO t VALUES (1)").await;
        let work = async {
            let tx = Tx::begin(&client).unwrap();
            tx.execute("DELETE FROM t", &[]).await.unwrap();
            tx.execute("SELECT pg_sleep(1)", &[]).await.unwrap();
            tx.commit_with(&[]).await.unwrap();
        };
        let cut = tokio::time::timeout(std::time::Duration::from_millis(300), work).await;
        assert!(cut.is_err(), "the transaction should have been cut at its sleep");
        // The connection answers once the sleep and the rollback are done, and the
        // row is still there; another connection may lock it at once.
        assert_eq!(count(&client).await, 1);
        let other = a.client().await.unwrap();
        other.batch_execute("SET lock_timeout = '1s'; DELETE FROM t").await.unwrap();
    }

    /// The statements before `commit_with` and those it runs are one transaction,
    /// and committed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_last_statements_run_in_the_transaction_and_are_committed() {
        let (a, client) = table("tx_commit", "CREATE TABLE t (a integer)").await;
        let tx = Tx::begin(&client).unwrap();
        let first: i64 = tx
            .query_one("INSERT INTO t VALUES (1) RETURNING txid_current()", &[])
            .await
            .unwrap()
            .get(0);
        let (two, three) = (2_i32, 3_i32);
        let rows = tx
            .commit_with(&[
                ("INSERT INTO t VALUES ($1) RETURNING txid_current()", vec![&two]),
                ("INSERT INTO t VALUES ($1) RETURNING txid_current()", vec![&three]),
            ])
            .await
            .unwrap();
        let txids: Vec<i64> = rows.iter().map(|r| r[0].get(0)).collect();
        assert_eq!(txids, [first, first], "one transaction");
        assert_eq!(committed(&a).await, 3);
    }

    /// A failing last statement is the error reported, and nothing of the
    /// transaction is committed (invariant 4), though the statement was not yet
    /// prepared on the connection: `COMMIT` did not go ahead of it (invariant 2).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_last_statement_is_reported_and_nothing_is_committed() {
        let (a, client) = table("tx_fail", "CREATE TABLE t (a integer PRIMARY KEY)").await;
        let tx = Tx::begin(&client).unwrap();
        tx.execute("INSERT INTO t VALUES (1)", &[]).await.unwrap();
        let one = 1_i32;
        let err = tx
            .commit_with(&[("INSERT INTO t VALUES ($1)", vec![&one])])
            .await
            .expect_err("a duplicate key must fail the commit");
        assert!(matches!(err, crate::store::StoreError::Conflict(_)), "{err}");
        assert_eq!(committed(&a).await, 0);
        client.execute("INSERT INTO t VALUES (5)", &[]).await.unwrap();
        assert_eq!(committed(&a).await, 1);
    }
}
