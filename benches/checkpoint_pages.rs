//! What a redb checkpoint writes for the dedup keys inserted since the last one, by
//! how many keys the bucket they go into already holds: why the embedded store's
//! dedup buckets are narrow (`src/store/embedded/dedup.rs`, BENCHMARKS.md "Narrow
//! dedup buckets").
//!
//! The relay writes every callback's dedup key (`[bucket end: 8][hash: 16]`, a 16-byte
//! value) and its event (~750 bytes, keyed in order) in a commit without an fsync,
//! and a checkpoint (a durable commit, quick repair on, as `redb_kv/checkpoint.rs`
//! makes it) writes every page those commits dirtied while the writers wait. Keys in
//! hash order scatter over the bucket's pages: into a bucket of many keys each insert
//! dirties a leaf (and branches) of its own; into a small one, a few leaves take them
//! all.
//!
//! For each size of the bucket being filled (`BENCH_SIZES`, default
//! `0,3000,20000,100000,1000000`), a fresh database holding that many keys in one
//! bucket (and their events), then rounds of `BENCH_INSERTS` (default `100,400`: half
//! a second and two seconds of 200 callbacks/s) one-callback commits into it, each
//! ended by a checkpoint: the checkpoint's time and the bytes this thread handed the
//! kernel during it (`wchar`), medians of `BENCH_ROUNDS` (default 7). The database
//! lives in `BENCH_DIR` (default the system's temporary directory: use the disk the
//! relay's data directory is on).
//!
//! Run: `cargo bench --bench checkpoint_pages`.

use std::time::{Duration, Instant};

use redb::{Database, Durability, TableDefinition};

const DEDUP: TableDefinition<&[u8], &[u8]> = TableDefinition::new("dedup");
const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
/// The bucket end of the keys written before the rounds, and of the rounds' keys.
const BUCKET: u64 = 1 << 40;

fn env_list(name: &str, default: &str) -> Vec<u64> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(|s| s.trim().parse().unwrap_or_else(|e| panic!("{name}: {s:?}: {e}")))
        .collect()
}

/// Bytes this thread handed the kernel so far.
fn written() -> u64 {
    let io = std::fs::read_to_string("/proc/thread-self/io").expect("/proc/thread-self/io");
    io.lines()
        .find_map(|l| l.strip_prefix("wchar: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("wchar in /proc/thread-self/io")
}

/// A dedup key in `BUCKET` with a random hash.
fn key() -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&BUCKET.to_be_bytes());
    k[8..16].copy_from_slice(&fastrand::u64(..).to_le_bytes());
    k[16..].copy_from_slice(&fastrand::u64(..).to_le_bytes());
    k
}

/// `count` callbacks (each its dedup key and its event, ids after `id`) in one commit
/// without an fsync, as the relay commits one.
fn callbacks(db: &Database, id: &mut u64, count: u64, body: &[u8]) {
    let mut tx = db.begin_write().expect("begin");
    tx.set_durability(Durability::None).expect("durability");
    {
        let mut dedup = tx.open_table(DEDUP).expect("dedup");
        let mut events = tx.open_table(EVENTS).expect("events");
        for _ in 0..count {
            *id += 1;
            dedup.insert(key().as_slice(), [0u8; 16].as_slice()).expect("insert");
            events.insert(*id, body).expect("insert");
        }
    }
    tx.commit().expect("commit");
}

/// A checkpoint as the relay makes one: its time and the bytes it wrote.
fn checkpoint(db: &Database) -> (Duration, u64) {
    let before = written();
    let began = Instant::now();
    let mut tx = db.begin_write().expect("begin");
    tx.set_quick_repair(true);
    tx.commit().expect("commit");
    (began.elapsed(), written() - before)
}

fn median<T: Copy + Ord>(mut v: Vec<T>) -> T {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let sizes = env_list("BENCH_SIZES", "0,3000,20000,100000,1000000");
    let inserts = env_list("BENCH_INSERTS", "100,400");
    let rounds = env_list("BENCH_ROUNDS", "7")[0] as usize;
    let dir = std::env::var("BENCH_DIR").map_or_else(|_| std::env::temp_dir(), Into::into);
    let dir = tempfile::tempdir_in(dir).expect("a temporary directory");
    let body = vec![b'x'; 750];
    let mut rows = Vec::new();
    for &size in &sizes {
        for &per in &inserts {
            let path = dir.path().join("pages.redb");
            let _ = std::fs::remove_file(&path);
            let db = Database::builder().set_cache_size(64 << 20).create(&path).expect("create");
            let mut id = 0;
            let mut left = size;
            while left > 0 {
                let batch = left.min(50_000);
                callbacks(&db, &mut id, batch, &body);
                left -= batch;
            }
            checkpoint(&db);
            let (mut took, mut bytes) = (Vec::new(), Vec::new());
            // One round first, not counted: the tree's pages into the cache.
            for round in 0..=rounds {
                for _ in 0..per {
                    callbacks(&db, &mut id, 1, &body);
                }
                let (t, b) = checkpoint(&db);
                if round > 0 {
                    took.push(t);
                    bytes.push(b);
                }
            }
            let (t, b) = (median(took), median(bytes));
            eprintln!("{size} keys, {per} inserts: {:.1} ms, {} KiB", ms(t), b / 1024);
            rows.push((size, per, t, b));
        }
    }
    println!(
        "\nmedians of {rounds} checkpoints; one-callback commits (a dedup key and a 750-byte \
         event) into a bucket already holding N keys, then a checkpoint:\n"
    );
    println!("| keys in the bucket | inserts since the last checkpoint | checkpoint (ms) | written (KiB) | per insert (KiB) |");
    println!("|---:|---:|---:|---:|---:|");
    for (size, per, t, b) in rows {
        let each = b as f64 / 1024.0 / per as f64;
        println!("| {size} | {per} | {:.1} | {} | {each:.1} |", ms(t), b / 1024);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
