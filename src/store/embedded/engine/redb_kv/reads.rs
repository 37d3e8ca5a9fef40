//! Reads that share a table within one store call: the table opened once per call
//! and thread, not once per lookup, while no write is committed.
//!
//! A lookup outside a transaction begins a read transaction, opens its table (a
//! lookup in redb's table of tables) and drops both: measured at 5% of the relay's
//! CPU under held ingest, where dispatch asks several tables per event
//! (BENCHMARKS.md, "What the blocking pool's hops cost"). Inside a [`read_scope`] the
//! thread keeps each table it opened, and uses it again while no write has been
//! committed since it opened it, by any thread.
//!
//! Invariant: a read in a scope sees every write committed before it, as a lookup
//! with its own read transaction would. A rule reads under the store's `lifecycle`
//! lock, then writes what it decided in a transaction of its own: a read that missed
//! the previous holder's commit would write back what that commit changed (seen under
//! load: a delivery sent twice, its record from before its attempt written again).
//! So a kept table is used again only while the database's commit count has not moved
//! since it was opened (read before the opening: a commit in between makes it open
//! again, never read stale). It saves the most where writes are rare between lookups
//! (a store call between commits); under held ingest, where the committer commits
//! every fraction of a millisecond, it keeps little. Nothing is kept past the scope or
//! the thread's own commit: a read transaction held by an idle thread, or by a call
//! waiting for its write to be durable, would keep redb from reusing the pages later
//! commits free.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use super::{err, RedbTree, Shared};
use crate::store::StoreError;

type Table = redb::ReadOnlyTable<&'static [u8], &'static [u8]>;

/// Says that this thread committed a write: the tables its scope kept are dropped (the
/// next read opens them again and sees the write). Called after `commit()` returns.
pub(super) fn committed() {
    let dropped = SCOPE.with(|s| std::mem::take(&mut s.borrow_mut().kept));
    // Dropped outside the borrow: a table's drop ends its read transaction.
    drop(dropped);
}

/// A table kept by the scope: of which database (weak: its address is not reused while
/// kept), which table, and the database's commit count before it was opened.
struct Kept {
    db: Weak<Shared>,
    name: &'static str,
    table: Table,
    commits: u64,
}

/// The tables kept by this thread's scope, and how deep the scope is (a store call
/// may call another).
struct Scope {
    depth: usize,
    kept: Vec<Kept>,
}

thread_local! {
    static SCOPE: RefCell<Scope> = const { RefCell::new(Scope { depth: 0, kept: Vec::new() }) };
}

/// Runs `f` with reads on this thread sharing their tables (see the module's doc).
/// Drops what it kept when the outermost scope ends, `f` panicking included.
pub(crate) fn read_scope<T>(f: impl FnOnce() -> T) -> T {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            let dropped = SCOPE.with(|s| {
                let mut s = s.borrow_mut();
                s.depth -= 1;
                if s.depth == 0 {
                    std::mem::take(&mut s.kept)
                } else {
                    Vec::new()
                }
            });
            // Dropped outside the borrow: a table's drop ends its read transaction.
            drop(dropped);
        }
    }
    SCOPE.with(|s| s.borrow_mut().depth += 1);
    let _leave = Leave;
    f()
}

/// Calls `f` with `tree`'s table: the scope's if it kept it, else freshly opened (and
/// kept, in a scope).
pub(super) fn with_table<T>(
    tree: &RedbTree,
    f: impl FnOnce(&Table) -> Result<T, redb::StorageError>,
) -> Result<T, StoreError> {
    let open = || {
        #[cfg(test)]
        OPENED.with(|n| n.set(n.get() + 1));
        tree.read()
    };
    SCOPE.with(|s| {
        // Neither opening a table nor `f` (one lookup) comes back here.
        let mut s = s.borrow_mut();
        if s.depth == 0 {
            drop(s);
            return f(&open()?).map_err(err);
        }
        let (db, name) = (&tree.db, tree.name);
        // Read before any opening: a commit after it makes the table stale.
        let commits = db.commits.load(Ordering::Acquire);
        let kept = s
            .kept
            .iter()
            .position(|k| std::ptr::eq(k.db.as_ptr(), Arc::as_ptr(db)) && k.name == name);
        let mut stale = None;
        let i = match kept {
            Some(i) if s.kept[i].commits == commits => i,
            Some(i) => {
                // Someone committed since it was opened: its snapshot is stale.
                stale = Some(std::mem::replace(&mut s.kept[i].table, open()?));
                s.kept[i].commits = commits;
                i
            }
            None => {
                s.kept.push(Kept { db: Arc::downgrade(db), name, table: open()?, commits });
                s.kept.len() - 1
            }
        };
        let read = f(&s.kept[i].table).map_err(err);
        drop(s);
        // Dropped outside the borrow, as in `committed`.
        drop(stale);
        read
    })
}

#[cfg(test)]
thread_local! {
    /// Tables opened by this thread's reads, for the tests.
    pub(super) static OPENED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
mod tests {
    use super::super::RedbDb;
    use super::*;
    use crate::store::embedded::background_flush::Pacing;
    use crate::store::embedded::engine::{EngineOptions, Tree};

    fn open(dir: &std::path::Path) -> RedbDb {
        RedbDb::open(&EngineOptions {
            path: dir,
            cache_capacity_bytes: 1 << 20,
            compression: false,
            flush: Pacing::fixed(std::time::Duration::from_secs(3600)),
        })
        .expect("open redb")
    }

    fn opened() -> usize {
        OPENED.with(std::cell::Cell::get)
    }

    #[test]
    fn lookups_in_a_scope_open_their_table_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = open(dir.path());
        let tree = db.open_tree("t").expect("tree");
        tree.insert(b"k", b"v").expect("insert");
        let before = opened();
        read_scope(|| {
            for _ in 0..100 {
                assert!(tree.contains_key(b"k").expect("read"));
            }
        });
        assert_eq!(opened() - before, 1);
        // Outside a scope, each lookup opens its own.
        let before = opened();
        for _ in 0..3 {
            assert!(tree.get(b"k").expect("read").is_some());
        }
        assert_eq!(opened() - before, 3);
    }

    #[test]
    fn a_scope_reads_its_own_writes_and_every_other_thread_s_committed_before() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = open(dir.path());
        let tree = db.open_tree("t").expect("tree");
        let other = tree.clone();
        read_scope(|| {
            assert!(tree.get(b"a").expect("read").is_none());
            // This thread's own write, read back.
            tree.insert(b"a", b"1").expect("insert");
            assert_eq!(tree.get(b"a").expect("read").as_deref(), Some(&b"1"[..]));
            // Another thread's write during the scope: the next read sees it (a rule
            // that read stale would write back what it changed).
            std::thread::spawn(move || other.insert(b"b", b"2").expect("insert"))
                .join()
                .expect("writer");
            assert_eq!(tree.get(b"b").expect("read").as_deref(), Some(&b"2"[..]));
            // This thread's next write opens the table again: everything committed.
            tree.remove(b"a").expect("remove");
            assert!(tree.get(b"a").expect("read").is_none());
            assert_eq!(tree.get(b"b").expect("read").as_deref(), Some(&b"2"[..]));
            assert_eq!(tree.len().expect("len"), 1);
            // A transaction's commit is this thread's write too.
            let both = [Tree::Redb(tree.clone())];
            db.transaction(&both.iter().collect::<Vec<_>>(), |t| {
                t[0].insert(b"c", b"3")?;
                Ok(())
            })
            .expect("transaction");
            assert_eq!(tree.get(b"c").expect("read").as_deref(), Some(&b"3"[..]));
            // Read once more: kept, the same table, no commit since.
            let before = opened();
            assert_eq!(tree.get(b"c").expect("read").as_deref(), Some(&b"3"[..]));
            assert_eq!(opened(), before);
            let other = tree.clone();
            std::thread::spawn(move || other.insert(b"d", b"4").expect("insert"))
                .join()
                .expect("writer");
            assert_eq!(tree.get(b"d").expect("read").as_deref(), Some(&b"4"[..]));
            assert_eq!(opened(), before + 1, "opened again after another thread's commit");
        });
    }

    #[test]
    fn nothing_is_kept_after_a_commit_or_the_scope_even_when_it_panics() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = open(dir.path());
        let tree = db.open_tree("t").expect("tree");
        let kept = || SCOPE.with(|s| (s.borrow().depth, s.borrow().kept.len()));
        read_scope(|| {
            read_scope(|| tree.contains_key(b"k").expect("read"));
            // The inner scope's end keeps the outer one's tables.
            assert_eq!(kept(), (1, 1));
            // A commit drops them: nothing is held while the call waits for durability.
            tree.insert(b"k", b"v").expect("insert");
            assert_eq!(kept(), (1, 0));
        });
        assert_eq!(kept(), (0, 0));
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            read_scope(|| {
                tree.contains_key(b"k").expect("read");
                panic!("a store call that panics");
            })
        }));
        assert!(panicked.is_err());
        assert_eq!(kept(), (0, 0));
    }
}
