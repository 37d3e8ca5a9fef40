//! Both engines against a `BTreeMap`: the backend's code relies on nothing else.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;

use super::{Batch, Db, Engine, EngineOptions, Tree, TxError};
use crate::store::embedded::background_flush::Pacing;
use crate::store::StoreError;

fn options(dir: &std::path::Path) -> EngineOptions<'_> {
    EngineOptions {
        path: dir,
        cache_capacity_bytes: 1 << 20,
        compression: true,
        flush: Pacing::fixed(Duration::from_millis(200)),
    }
}

fn open(engine: Engine, dir: &std::path::Path) -> Db {
    Db::open(engine, &options(dir)).unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Insert(Vec<u8>, Vec<u8>),
    Remove(Vec<u8>),
    Batch(Vec<(Vec<u8>, Vec<u8>)>),
    /// A transaction that writes, then aborts (when the flag says so).
    Tx(Vec<u8>, Vec<u8>, bool),
    /// `apply_shrinking`: the same map as a batch, whatever the sizes.
    Shrink(Vec<(Vec<u8>, Vec<u8>)>),
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop_oneof![Just(0u8), Just(1), Just(0xfe), Just(0xff)], 0..4)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (key(), key()).prop_map(|(k, v)| Op::Insert(k, v)),
        key().prop_map(Op::Remove),
        prop::collection::vec((key(), key()), 0..4).prop_map(Op::Batch),
        (key(), key(), any::<bool>()).prop_map(|(k, v, a)| Op::Tx(k, v, a)),
        prop::collection::vec((key(), key()), 0..4).prop_map(Op::Shrink),
    ]
}

fn entries(iter: impl Iterator<Item = super::Entry>) -> Vec<(Vec<u8>, Vec<u8>)> {
    iter.map(|e| e.map(|(k, v)| (k.to_vec(), v.to_vec()))).collect::<Result<_, _>>().unwrap()
}

fn check(tree: &Tree, model: &BTreeMap<Vec<u8>, Vec<u8>>, probe: &[u8]) {
    let all: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(entries(tree.iter()), all);
    let mut back = entries(tree.iter().rev());
    back.reverse();
    assert_eq!(back, all);
    let prefixed: Vec<_> = all.iter().filter(|(k, _)| k.starts_with(probe)).cloned().collect();
    assert_eq!(entries(tree.scan_prefix(probe)), prefixed, "prefix {probe:?}");
    let mut rev = entries(tree.scan_prefix(probe).rev());
    rev.reverse();
    assert_eq!(rev, prefixed);
    let from: Vec<_> = all.iter().filter(|(k, _)| k.as_slice() >= probe).cloned().collect();
    assert_eq!(entries(tree.range(probe.to_vec()..)), from);
    let below: Vec<_> = all.iter().filter(|(k, _)| k.as_slice() < probe).cloned().collect();
    assert_eq!(entries(tree.range(..probe.to_vec())), below);
    assert_eq!(tree.len().unwrap(), model.len() as u64);
    let first = tree.iter().next().transpose().unwrap();
    assert_eq!(first.map(|(k, _)| k.to_vec()), model.keys().next().cloned());
    assert_eq!(tree.last().unwrap().map(|(k, _)| k.to_vec()), model.keys().next_back().cloned());
    assert_eq!(tree.get(probe).unwrap().map(|v| v.to_vec()), model.get(probe).cloned());
}

/// Applies `op` to `tree` and to the model, checking what the engine returns.
fn apply(db: &Db, tree: &Tree, model: &mut BTreeMap<Vec<u8>, Vec<u8>>, op: &Op) {
    match op {
        Op::Insert(k, v) => {
            let old = tree.insert(k, v).unwrap().map(|v| v.to_vec());
            assert_eq!(old, model.insert(k.clone(), v.clone()));
        }
        Op::Remove(k) => {
            let old = tree.remove(k).unwrap().map(|v| v.to_vec());
            assert_eq!(old, model.remove(k));
        }
        Op::Batch(writes) => {
            let mut batch = Batch::default();
            for (k, v) in writes {
                batch.insert(k, v);
                model.insert(k.clone(), v.clone());
            }
            tree.apply_batch(batch).unwrap();
        }
        Op::Shrink(writes) => {
            let mut batch = Batch::default();
            for (k, v) in writes {
                batch.insert(k, v);
                model.insert(k.clone(), v.clone());
            }
            tree.apply_shrinking(batch).unwrap();
        }
        Op::Tx(k, v, aborts) => {
            let result = db.transaction(&[tree], |t| {
                t[0].insert(k, v)?;
                // A transaction sees its own write.
                assert_eq!(t[0].get(k)?.map(|v| v.to_vec()), Some(v.clone()));
                if *aborts {
                    return Err(TxError::Abort(StoreError::Config("abort".into())));
                }
                Ok(())
            });
            assert_eq!(result.is_ok(), !aborts);
            if !aborts {
                model.insert(k.clone(), v.clone());
            }
        }
    }
}

fn run(engine: Engine, ops: &[Op], probe: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let mut model = BTreeMap::new();
    {
        let db = open(engine, dir.path());
        let tree = db.open_tree("t").unwrap();
        for op in ops {
            apply(&db, &tree, &mut model, op);
        }
        check(&tree, &model, probe);
        db.flush().unwrap();
    }
    // What was flushed is there after a reopen.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let db = loop {
        match Db::open(engine, &options(dir.path())) {
            Ok(db) => break db,
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("{e}"),
        }
    };
    check(&db.open_tree("t").unwrap(), &model, probe);
    assert!(db.tree_names().unwrap().contains(&"t".to_owned()));
}

/// A step of the crash model: a write, or one of the two ways to make writes durable.
#[derive(Clone, Debug)]
enum Step {
    Write(Op),
    /// `Db::flush`: the redo log synced.
    Flush,
    /// `Db::checkpoint`: a durable redb commit, the log emptied.
    Checkpoint,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => op().prop_map(Step::Write),
        2 => Just(Step::Flush),
        1 => Just(Step::Checkpoint),
    ]
}

/// redb under `steps`, then what a power cut leaves (`Db::crash_image`), reopened: it
/// holds exactly the writes up to the last flush or checkpoint, whatever mix of the
/// two came before (the redo log's records after the checkpoint applied again, those
/// never synced gone). No periodic checkpoint runs (an hour apart), so the durable
/// point is the test's.
fn crash(steps: &[Step], probe: &[u8]) {
    let (dir, image) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let opts =
        |path| EngineOptions { flush: Pacing::fixed(Duration::from_secs(3600)), ..options(path) };
    let mut model = BTreeMap::new();
    let mut durable = BTreeMap::new();
    {
        let db = Db::open(Engine::Redb, &opts(dir.path())).unwrap();
        let tree = db.open_tree("t").unwrap();
        for step in steps {
            match step {
                Step::Write(op) => apply(&db, &tree, &mut model, op),
                Step::Flush => {
                    db.flush().unwrap();
                    durable = model.clone();
                }
                Step::Checkpoint => {
                    db.checkpoint().unwrap();
                    durable = model.clone();
                }
            }
        }
        assert!(db.crash_image(image.path()).unwrap());
    }
    let db = Db::open(Engine::Redb, &opts(image.path())).unwrap();
    check(&db.open_tree("t").unwrap(), &durable, probe);
    // The recovery was itself made durable: a second crash right after the open
    // loses nothing of it.
    let again = tempfile::tempdir().unwrap();
    assert!(db.crash_image(again.path()).unwrap());
    drop(db);
    let db = Db::open(Engine::Redb, &opts(again.path())).unwrap();
    check(&db.open_tree("t").unwrap(), &durable, probe);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn both_engines_behave_as_an_ordered_map(ops in prop::collection::vec(op(), 0..24), probe in key()) {
        run(Engine::Sled, &ops, &probe);
        run(Engine::Redb, &ops, &probe);
    }

    #[test]
    fn a_power_cut_on_redb_leaves_exactly_what_was_made_durable(
        steps in prop::collection::vec(step(), 0..32),
        probe in key(),
    ) {
        crash(&steps, &probe);
    }
}

/// Writes made durable by the redo log alone (no checkpoint since) are in the
/// database after a power cut; a log copied in from another store is not applied.
#[test]
fn the_redo_log_is_applied_to_its_own_database_only() {
    let (dir, image, other) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let opts =
        |path| EngineOptions { flush: Pacing::fixed(Duration::from_secs(3600)), ..options(path) };
    {
        let db = Db::open(Engine::Redb, &opts(dir.path())).unwrap();
        let tree = db.open_tree("t").unwrap();
        for i in 0u32..100 {
            tree.insert(i.to_be_bytes(), vec![7u8; 1000]).unwrap();
        }
        db.flush().unwrap();
        tree.insert(b"unsynced", b"gone").unwrap();
        assert!(db.crash_image(image.path()).unwrap());
        // Another store, its log replaced by this one's.
        drop(Db::open(Engine::Redb, &opts(other.path())).unwrap());
        std::fs::copy(image.path().join("redo.log"), other.path().join("redo.log")).unwrap();
    }
    let db = Db::open(Engine::Redb, &opts(image.path())).unwrap();
    let tree = db.open_tree("t").unwrap();
    assert_eq!(tree.len().unwrap(), 100, "the synced writes, not the unsynced one");
    assert!(tree.get(b"unsynced").unwrap().is_none());
    let db = Db::open(Engine::Redb, &opts(other.path())).unwrap();
    assert_eq!(db.open_tree("t").unwrap().len().unwrap(), 0, "a foreign log applied");
}

#[test]
fn the_successor_of_a_prefix_bounds_it() {
    assert_eq!(super::tree::successor(b"ab"), Some(b"ac".to_vec()));
    assert_eq!(super::tree::successor(&[1, 0xff]), Some(vec![2]));
    assert_eq!(super::tree::successor(&[0xff, 0xff]), None);
    assert_eq!(super::tree::successor(b""), None);
}

#[test]
fn a_second_open_of_a_redb_data_dir_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let _db = open(Engine::Redb, dir.path());
    let err = Db::open(Engine::Redb, &options(dir.path())).err().unwrap().to_string();
    assert!(err.contains("in use by another process") && err.contains("data_dir"), "{err}");
}

#[test]
fn a_data_dir_of_the_other_engine_is_refused_with_what_to_do() {
    for (has, asked) in [(Engine::Sled, Engine::Redb), (Engine::Redb, Engine::Sled)] {
        let dir = tempfile::tempdir().unwrap();
        let db = open(has, dir.path());
        db.open_tree("t").unwrap().insert(b"k", b"v").unwrap();
        db.flush().unwrap();
        drop(db);
        std::thread::sleep(Duration::from_millis(300));
        let err = Db::open(asked, &options(dir.path())).err().unwrap().to_string();
        let wanted =
            format!("holds a {} store and storage.backend is {}", has.name(), asked.name());
        assert!(err.contains(&wanted) && err.contains("hookrelay migrate --to"), "{err}");
    }
}

/// An empty unfinished snapshot (left by a snapshot cut short on a full disk) makes
/// sled 0.34 itself refuse the store; opened through the engine it is removed first,
/// and everything is there.
#[test]
fn an_unfinished_sled_snapshot_is_removed_before_sled_opens() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(Engine::Sled, dir.path());
    db.open_tree("t").unwrap().insert(b"k", b"v").unwrap();
    db.flush().unwrap();
    drop(db);
    std::thread::sleep(Duration::from_millis(300));
    let stray = dir.path().join("snap.7FFFFFFFFFFFFFFF.generating");
    std::fs::File::create(&stray).unwrap();
    assert!(!super::sled_kv::opens_as_is(dir.path()), "sled alone cannot open beside it");
    let db = open(Engine::Sled, dir.path());
    assert!(!stray.exists());
    assert_eq!(
        db.open_tree("t").unwrap().get(b"k").unwrap().map(|v| v.to_vec()),
        Some(b"v".to_vec())
    );
}

/// The engine boundary is neutral: no file but `sled_kv.rs` names a sled type, so the
/// backend and the redb path cannot come to depend on sled (issue 41).
#[test]
fn no_sled_type_outside_its_own_file() {
    fn walk(dir: &std::path::Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs")
                && !path.ends_with("engine/sled_kv.rs")
            {
                let text = std::fs::read_to_string(&path).unwrap();
                for (n, line) in text.lines().enumerate() {
                    let code = line.split("//").next().unwrap_or("");
                    if code.contains(concat!("sled", "::")) {
                        found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                }
            }
        }
    }
    let mut found = Vec::new();
    walk(std::path::Path::new("src"), &mut found);
    assert!(found.is_empty(), "sled types outside sled_kv.rs:\n{}", found.join("\n"));
}
