//! Both engines against a `BTreeMap`: the backend's code relies on nothing else.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;

use super::{Batch, Db, Engine, EngineOptions, Tree, TxError};
use crate::store::StoreError;

fn options(dir: &std::path::Path) -> EngineOptions<'_> {
    EngineOptions {
        path: dir,
        cache_capacity_bytes: 1 << 20,
        compression: true,
        flush_interval: Duration::from_millis(200),
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

fn run(engine: Engine, ops: &[Op], probe: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let mut model = BTreeMap::new();
    {
        let db = open(engine, dir.path());
        let tree = db.open_tree("t").unwrap();
        for op in ops {
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
                    let result = db.transaction(&[&tree], |t| {
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn both_engines_behave_as_an_ordered_map(ops in prop::collection::vec(op(), 0..24), probe in key()) {
        run(Engine::Sled, &ops, &probe);
        run(Engine::Redb, &ops, &probe);
    }
}

#[test]
fn the_successor_of_a_prefix_bounds_it() {
    assert_eq!(super::successor(b"ab"), Some(b"ac".to_vec()));
    assert_eq!(super::successor(&[1, 0xff]), Some(vec![2]));
    assert_eq!(super::successor(&[0xff, 0xff]), None);
    assert_eq!(super::successor(b""), None);
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
