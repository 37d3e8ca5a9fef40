//! The PostgreSQL schema: versioned migrations embedded in the binary, applied at open
//! under an advisory lock (two relays starting together migrate once), and a refusal
//! to run on a schema newer than this build knows.

use super::pg;
use crate::store::StoreError;

/// Each migration, in order; the schema's version is how many have been applied.
/// Never edit one that has shipped: add the next.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: the first layout.
    r#"
CREATE TABLE events (
    id      bigint PRIMARY KEY,
    inbox   boolean NOT NULL,
    source  text NOT NULL,
    event   text NOT NULL,
    status  text NOT NULL,
    meta    bytea NOT NULL,
    body    bytea
);
CREATE INDEX events_inbox ON events (id) WHERE inbox;
CREATE TABLE dedup (
    hash     bytea PRIMARY KEY,
    original bigint NOT NULL,
    until_us bigint NOT NULL
);
CREATE INDEX dedup_until ON dedup (until_us);
CREATE TABLE deliveries (
    event            bigint NOT NULL,
    destination      text NOT NULL,
    state            text NOT NULL,
    due_us           bigint,
    record           bytea NOT NULL,
    claim_token      bigint,
    claim_owner      text,
    claim_expires_us bigint,
    PRIMARY KEY (event, destination)
);
CREATE INDEX deliveries_schedule ON deliveries (destination, due_us, event) WHERE due_us IS NOT NULL;
CREATE INDEX deliveries_active ON deliveries (destination, state) WHERE state IN ('pending', 'retrying', 'held', 'dead');
CREATE INDEX deliveries_dead ON deliveries (event, destination) WHERE state = 'dead';
CREATE TABLE queues (
    destination text NOT NULL,
    resource    bytea NOT NULL,
    head        bigint NOT NULL,
    tail        bigint NOT NULL,
    len         bigint NOT NULL,
    PRIMARY KEY (destination, resource)
);
CREATE TABLE paused (destination text PRIMARY KEY);
CREATE TABLE upstream (key text PRIMARY KEY, value bytea NOT NULL);
CREATE SEQUENCE claim_tokens;
"#,
    // 2: the relays of the fleet (`Store::heartbeat`), to divide destinations' limits.
    r#"
CREATE TABLE relays (
    owner      text PRIMARY KEY,
    started_us bigint NOT NULL,
    seen_us    bigint NOT NULL
);
"#,
    // 3: callbacks stored per (source, event), for the fleet's missing-callbacks
    // comparison (`Store::received_counts`); a row per relay process, so that no two
    // relays' commits wait on one row.
    r#"
CREATE TABLE received (
    source text NOT NULL,
    event  text NOT NULL,
    relay  text NOT NULL,
    n      bigint NOT NULL,
    PRIMARY KEY (source, event, relay)
);
"#,
    // 4: the queue tables are updated several times per row (dispatch, claim, record)
    // and read from the front of their partial indexes: vacuum them after 1% of dead
    // rows instead of 20%, so that the dead entries at the front of the schedule do
    // not slow every claim as the tables grow; fillfactor leaves room for HOT updates.
    r#"
ALTER TABLE deliveries SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02, fillfactor = 80);
ALTER TABLE events SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02, fillfactor = 90);
ALTER TABLE dedup SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000);
ALTER TABLE received SET (fillfactor = 50);
ALTER TABLE relays SET (fillfactor = 50);
"#,
    // 5: search by resource (`EventFilter::resource`): the resource each event is
    // about, set at ingest, and its index (events stored before have none). The
    // column is named `record`, the word of the time: a rename would stop the relays
    // of a fleet not upgraded yet, so it stays.
    r#"
ALTER TABLE events ADD COLUMN record text;
CREATE INDEX events_record ON events (record, id) WHERE record IS NOT NULL;
"#,
    // 6: leases of the tasks one relay runs for the fleet (`lead.rs`), on the
    // database's clock: they run out when their holder stops renewing them, where a
    // session lock outlived a half-open session by hours.
    r#"
CREATE TABLE leases (
    task       text PRIMARY KEY,
    holder     text NOT NULL,
    expires_us bigint NOT NULL
);
ALTER TABLE leases SET (fillfactor = 50);
"#,
    // 7: the audit ledger (`store/lifecycle/ledger.rs`): counters per hour of receive
    // time, written in the transactions that change what they count; `shard` spreads
    // one hot counter over rows, so that concurrent transactions seldom wait on one
    // row. It starts at the next event: those stored before are not accounted.
    r#"
CREATE TABLE audit (
    hour        bigint NOT NULL,
    source      text NOT NULL,
    event       text NOT NULL,
    destination text NOT NULL,
    count       text NOT NULL,
    shard       smallint NOT NULL,
    n           bigint NOT NULL,
    PRIMARY KEY (hour, source, event, destination, count, shard)
);
ALTER TABLE audit SET (fillfactor = 50);
CREATE TABLE audit_start (start bigint NOT NULL);
INSERT INTO audit_start SELECT coalesce(max(id), 0) + 1 FROM events;
"#,
    // 8: the journal of admin changes (`journal.rs`), one for the fleet.
    r#"
CREATE TABLE journal (
    at_us  bigint NOT NULL,
    tie    bigint NOT NULL,
    who    text NOT NULL,
    action text NOT NULL,
    entry  bytea NOT NULL,
    PRIMARY KEY (at_us, tie)
);
"#,
];

/// Key of the advisory lock held while migrating (any constant shared by all relays).
const MIGRATION_LOCK: i64 = 0x686f_6f6b_7265_6c61; // "hookrela"

/// Brings `schema` to this build's version; refuses a newer one.
pub(super) async fn migrate(client: &mut pg::Client, schema: &str) -> Result<u32, StoreError> {
    let quoted = quote_ident(schema);
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {quoted};
         CREATE TABLE IF NOT EXISTS {quoted}.schema_version (version integer NOT NULL);
         SET LOCAL search_path = {quoted};"
    ))
    .await?;
    let row = tx.query_opt("SELECT version FROM schema_version", &[]).await?;
    let found: i32 = match row {
        Some(r) => r.get(0),
        None => {
            tx.execute("INSERT INTO schema_version VALUES (0)", &[]).await?;
            0
        }
    };
    let known = MIGRATIONS.len() as i32;
    if found > known {
        return Err(StoreError::Schema { found: found.to_string(), supported: known as u32 });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.batch_execute(sql).await?;
        tx.execute("UPDATE schema_version SET version = $1", &[&(i as i32 + 1)]).await?;
        tracing::info!(schema, version = i + 1, "applied PostgreSQL migration");
    }
    tx.commit().await?;
    Ok(known as u32)
}

/// The schema's version now (0: none yet), read without changing anything.
pub(super) async fn version(client: &pg::Client, schema: &str) -> Result<i32, StoreError> {
    let table = format!("{}.schema_version", quote_ident(schema));
    let exists: Option<String> =
        client.query_one("SELECT to_regclass($1)::text", &[&table]).await?.get(0);
    if exists.is_none() {
        return Ok(0);
    }
    let row = client.query_opt(&format!("SELECT version FROM {table}"), &[]).await?;
    Ok(row.map_or(0, |r| r.get(0)))
}

/// `name` as a quoted SQL identifier.
pub(super) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
