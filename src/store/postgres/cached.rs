//! Statements prepared once per connection and reused by their text (deadpool's
//! statement cache). Why: tokio-postgres sends a statement given as text as a fresh
//! unnamed one, which PostgreSQL parses, analyses and plans at every call; on the hot
//! path that was about a third of the server's CPU per callback (issue 44, perf on
//! `benches/fleet.rs`). A prepared one is parsed once, and planned once when its
//! generic plan is as good as a custom one (PostgreSQL decides after five runs).
//!
//! Every statement of the store goes through here except those run once (schema,
//! migrations) and those on a connection taken out of the pool.
//!
//! A prepared statement outlives a change of the schema made by another relay of the
//! fleet (an upgrade's migration): PostgreSQL plans it again by itself, but refuses it
//! when its result's columns changed type ("cached plan must not change result
//! type"); such a call is made again unprepared (the cached one keeps failing, each
//! time made again, until the connection is recycled).

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;

use super::pg;

/// The parameters of a statement.
pub(super) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// `query`, `query_one` and `execute` of a statement prepared once per connection.
#[async_trait]
pub(super) trait Cached {
    /// The rows of `sql`.
    async fn cached_query(
        &self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Vec<pg::Row>, tokio_postgres::Error>;
    /// The one row of `sql` (an error if it returns another number).
    async fn cached_query_one(
        &self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<pg::Row, tokio_postgres::Error>;
    /// The row of `sql`, if any (an error if more).
    async fn cached_query_opt(
        &self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Option<pg::Row>, tokio_postgres::Error>;
    /// The rows `sql` changed.
    async fn cached_execute(
        &self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<u64, tokio_postgres::Error>;
}

/// Every deadpool client and transaction (each has `prepare_cached`).
#[async_trait]
impl<C: GenericClient> Cached for C {
    async fn cached_query(
        &self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Vec<pg::Row>, tokio_postgres::Error> {
        let statement = self.prepare_cached(sql).await?;
        match self.query(&statement, params).await {
            Err(e) if stale(&e) => self.query(&self.prepare(sql).await?, params).await,
            done => done,
        }
    }

    async fn cached_query_one(
        &self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<pg::Row, tokio_postgres::Error> {
        let statement = self.prepare_cached(sql).await?;
        match self.query_one(&statement, params).await {
            Err(e) if stale(&e) => self.query_one(&self.prepare(sql).await?, params).await,
            done => done,
        }
    }

    async fn cached_query_opt(
        &self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Option<pg::Row>, tokio_postgres::Error> {
        let statement = self.prepare_cached(sql).await?;
        match self.query_opt(&statement, params).await {
            Err(e) if stale(&e) => self.query_opt(&self.prepare(sql).await?, params).await,
            done => done,
        }
    }

    async fn cached_execute(
        &self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<u64, tokio_postgres::Error> {
        let statement = self.prepare_cached(sql).await?;
        match self.execute(&statement, params).await {
            Err(e) if stale(&e) => self.execute(&self.prepare(sql).await?, params).await,
            done => done,
        }
    }
}

/// Runs `statements` on `client` pipelined: sent together, run in this order, one
/// round trip for all instead of one each; the rows of each, or the first error in
/// that order (after which the statements of a transaction fail as aborted).
///
/// All are prepared before any runs (no I/O for those already prepared on this
/// connection), so that none is sent ahead of an earlier one still being prepared.
/// Inside a transaction a statement a schema change made stale fails the
/// transaction as any error does (the unprepared retry of [`Cached`] could not run in
/// it either).
pub(super) async fn pipelined<C: GenericClient + Sync>(
    client: &C,
    statements: &[(&str, Vec<&(dyn ToSql + Sync)>)],
) -> Result<Vec<Vec<pg::Row>>, tokio_postgres::Error> {
    let prepared = prepare_all(client, statements).await?;
    run_prepared(client, &prepared, statements).await
}

/// `statements`, each prepared (no I/O for those already prepared on this
/// connection): the first half of [`pipelined`].
pub(super) async fn prepare_all<C: GenericClient + Sync>(
    client: &C,
    statements: &[(&str, Vec<&(dyn ToSql + Sync)>)],
) -> Result<Vec<tokio_postgres::Statement>, tokio_postgres::Error> {
    futures_util::future::try_join_all(statements.iter().map(|(sql, _)| client.prepare_cached(sql)))
        .await
}

/// Runs `prepared` with the parameters of `statements`, pipelined: the second half of
/// [`pipelined`]. Each is sent when this future is first polled (what lets a caller
/// send more behind them: `tx.rs`).
pub(super) async fn run_prepared<C: GenericClient + Sync>(
    client: &C,
    prepared: &[tokio_postgres::Statement],
    statements: &[(&str, Vec<&(dyn ToSql + Sync)>)],
) -> Result<Vec<Vec<pg::Row>>, tokio_postgres::Error> {
    futures_util::future::try_join_all(
        prepared.iter().zip(statements).map(|(st, (_, params))| client.query(st, params)),
    )
    .await
}

/// Whether `e` is PostgreSQL refusing a prepared statement whose result's type a
/// change of the schema changed.
fn stale(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED)
}

#[cfg(test)]
mod tests {
    use super::{pipelined, Cached};
    use crate::store::postgres::tests::two_relays;

    /// A statement prepared before another relay changed a column's type still runs,
    /// and says what the table holds now.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_statement_prepared_before_a_column_changed_type_still_runs() {
        let (a, b) = two_relays("cached").await;
        let client = a.client().await.unwrap();
        client.batch_execute("CREATE TABLE t (a integer); INSERT INTO t VALUES (7)").await.unwrap();
        let rows = client.cached_query("SELECT a FROM t", &[]).await.unwrap();
        assert_eq!(rows[0].get::<_, i32>(0), 7);
        let other = b.client().await.unwrap();
        other.batch_execute("ALTER TABLE t ALTER COLUMN a TYPE text").await.unwrap();
        for _ in 0..2 {
            let rows = client.cached_query("SELECT a FROM t", &[]).await.unwrap();
            assert_eq!(rows[0].get::<_, String>(0), "7");
            let n = client.cached_execute("UPDATE t SET a = a", &[]).await.unwrap();
            assert_eq!(n, 1);
        }
    }

    /// Pipelined statements run in the order given, even when an earlier one is not
    /// yet prepared on the connection and a later one is; the error reported is the
    /// first statement's that failed, not the "transaction aborted" of those after it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pipelined_statements_run_in_order_and_report_the_first_failure() {
        let (a, _b) = two_relays("pipelined").await;
        let mut client = a.client().await.unwrap();
        client.batch_execute("CREATE TABLE p (k integer PRIMARY KEY, v integer)").await.unwrap();
        // The later statement is prepared (cached) already, the earlier one not.
        let bump = "UPDATE p SET v = v * 10 + 2 WHERE k = 1";
        client.cached_execute(bump, &[]).await.unwrap();
        let tx = client.transaction().await.unwrap();
        let one = 1i32;
        let rows = pipelined(
            &tx,
            &[
                ("INSERT INTO p (k, v) VALUES ($1, 1)", vec![&one]),
                (bump, vec![]),
                ("SELECT v FROM p WHERE k = $1", vec![&one]),
            ],
        )
        .await
        .unwrap();
        assert_eq!(rows[2][0].get::<_, i32>(0), 12, "the update ran before the insert");
        tx.commit().await.unwrap();
        let tx = client.transaction().await.unwrap();
        let err = pipelined(
            &tx,
            &[
                (bump, vec![]),
                ("INSERT INTO p (k, v) VALUES ($1, 1)", vec![&one]),
                ("SELECT v FROM p WHERE k = $1", vec![&one]),
            ],
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION), "{err}");
    }
}
