//! The redo log's tests: its format read back whole, torn and foreign, and its file
//! recycled, grown and shrunk.

use super::format::{HEADER, RECORD_HEAD};
use super::*;

/// A write for [`ops_of`]: table, key, and the value (none: a remove).
type Write<'a> = (&'a str, &'a [u8], Option<&'a [u8]>);

fn ops_of(writes: &[Write<'_>]) -> Ops {
    let mut ops = Ops::default();
    for (table, key, value) in writes {
        match value {
            Some(v) => ops.insert(table, key, v),
            None => ops.remove(table, key),
        }
    }
    ops
}

/// A log in a temp dir with `n` records synced, and its bytes.
fn written(n: u64) -> (tempfile::TempDir, RedoLog, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let log = RedoLog::create(dir.path(), 7).unwrap();
    for i in 0..n {
        let w = log.writer();
        log.append(&w, &ops_of(&[("records", &i.to_be_bytes(), Some(b"body"))]));
    }
    log.sync().unwrap();
    let mut bytes = std::fs::read(dir.path().join(FILE_NAME)).unwrap();
    assert!(bytes[log.written_len()..].iter().all(|b| *b == 0), "zeros past the records");
    bytes.truncate(log.written_len());
    (dir, log, bytes)
}

fn lsns(read: &Read<'_>) -> (Vec<u64>, usize) {
    match read {
        Read::Foreign => panic!("read as foreign"),
        Read::Records { records, torn } => (records.iter().map(|r| r.lsn).collect(), *torn),
    }
}

#[test]
fn writes_come_back_in_order() {
    let ops = ops_of(&[
        ("records", b"k1", Some(b"v1")),
        ("schedule", b"k2", None),
        ("records", b"", Some(b"")),
    ]);
    assert_eq!(
        super::ops(&ops.0).unwrap(),
        vec![
            Op::Insert { table: "records", key: b"k1", value: b"v1" },
            Op::Remove { table: "schedule", key: b"k2" },
            Op::Insert { table: "records", key: b"", value: b"" },
        ]
    );
    assert!(super::ops(&ops.0[..ops.0.len() - 1]).is_err(), "a cut payload is refused");
}

#[test]
fn the_records_after_the_checkpoint_are_read_and_a_torn_tail_is_not() {
    let (_dir, _log, bytes) = written(5);
    assert_eq!(lsns(&read(&bytes, 7, 0)), (vec![1, 2, 3, 4, 5], 0));
    assert_eq!(lsns(&read(&bytes, 7, 3)), (vec![4, 5], 0));
    assert_eq!(lsns(&read(&bytes, 7, 5)), (vec![], 0));
    // Every cut of the last record: it is dropped, the others kept.
    let last = (bytes.len() - HEADER) / 5;
    for cut in 1..last {
        let (kept, torn) = lsns(&read(&bytes[..bytes.len() - cut], 7, 0));
        assert_eq!(kept, vec![1, 2, 3, 4], "cut {cut}");
        assert_eq!(torn, last - cut, "cut {cut}");
    }
    // The same cuts in a file zero-filled ahead, as the log's is: the same.
    for cut in 1..last {
        let mut zeroed = bytes.clone();
        zeroed[bytes.len() - cut..].fill(0);
        zeroed.extend_from_slice(&[0; 4096]);
        let (kept, torn) = lsns(&read(&zeroed, 7, 0));
        assert_eq!(kept, vec![1, 2, 3, 4], "cut {cut}");
        // Its head whole: the record's length is torn; its number cut: nothing
        // tells it from zeros.
        if last - cut >= RECORD_HEAD {
            assert_eq!(torn, last, "cut {cut}");
        } else {
            assert!(torn == last || torn == 0, "cut {cut}: {torn}");
        }
    }
    // Zeros after the last record are no torn write.
    let mut ahead = bytes.clone();
    ahead.extend_from_slice(&[0; 4096]);
    assert_eq!(lsns(&read(&ahead, 7, 0)), (vec![1, 2, 3, 4, 5], 0));
    // A flipped bit in record 3: 1 and 2 only.
    let mut bad = bytes.clone();
    let third = HEADER + 2 * last + RECORD_HEAD + 2;
    bad[third] ^= 0x10;
    assert_eq!(lsns(&read(&bad, 7, 0)).0, vec![1, 2]);
}

#[test]
fn another_stores_log_or_a_gap_is_never_applied() {
    let (_dir, _log, bytes) = written(3);
    assert!(matches!(read(&bytes, 8, 0), Read::Foreign), "another id");
    assert!(matches!(read(&bytes[..10], 7, 0), Read::Foreign), "no header");
    assert!(matches!(read(b"not a log at all, no", 7, 0), Read::Foreign));
    // The checkpoint says 5 and the log ends at 3: nothing to apply. A log whose
    // first record after the checkpoint is not the next one: nothing either.
    assert_eq!(lsns(&read(&bytes, 7, 5)).0, Vec::<u64>::new());
    let (_dir, log, _) = written(0);
    {
        let w = log.writer();
        for _ in 0..3 {
            log.append(&w, &ops_of(&[("t", b"k", None)]));
        }
    }
    // Records 1-3 covered by a checkpoint, 4 and 5 synced: never applied after 0.
    log.emptied(&log.writer()).unwrap();
    {
        let w = log.writer();
        log.append(&w, &ops_of(&[("t", b"k", None)]));
        log.append(&w, &ops_of(&[("t", b"k", None)]));
    }
    log.sync().unwrap();
    let bytes = std::fs::read(_dir.path().join(FILE_NAME)).unwrap();
    assert_eq!(lsns(&read(&bytes, 7, 0)).0, Vec::<u64>::new(), "a gap after 0");
    assert_eq!(lsns(&read(&bytes, 7, 3)).0, vec![4, 5]);
}

#[test]
fn a_checkpoint_empties_the_log_and_numbering_goes_on() {
    let (dir, log, _) = written(4);
    log.emptied(&log.writer()).unwrap();
    let bytes = std::fs::read(dir.path().join(FILE_NAME)).unwrap();
    assert_eq!(lsns(&read(&bytes, 7, 4)), (vec![], 0), "emptied: nothing after 4");
    {
        let w = log.writer();
        assert_eq!(log.last(&w), 4);
        log.append(&w, &ops_of(&[("t", b"k", Some(b"v"))]));
    }
    log.sync().unwrap();
    let bytes = std::fs::read(dir.path().join(FILE_NAME)).unwrap();
    assert_eq!(lsns(&read(&bytes, 7, 4)), (vec![5], 0));
}

/// The file's length, and its allocated bytes.
fn size(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(dir.join(FILE_NAME)).unwrap();
    (meta.len(), meta.blocks() * 512)
}

/// Invariant 4: cycles of records of every size, each checkpoint followed by the
/// next cycle written from the start over the last; at each checkpoint and after
/// each sync, the file read for the checkpoint gives exactly the records synced
/// since, never one of an earlier cycle, and no torn write.
#[test]
fn a_recycled_log_gives_back_only_the_records_since_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let log = RedoLog::create(dir.path(), 7).unwrap();
    let mut rng = fastrand::Rng::with_seed(44);
    let mut checkpoint = 0;
    for cycle in 0..40 {
        let mut synced = Vec::new();
        for _ in 0..rng.usize(0..6) {
            {
                let w = log.writer();
                for _ in 0..rng.usize(1..4) {
                    let value = vec![rng.u8(..); rng.usize(0..3000)];
                    log.append(&w, &ops_of(&[("t", b"k", Some(&value))]));
                }
            }
            log.sync().unwrap();
            synced = (checkpoint + 1..=log.last(&log.writer())).collect();
            let bytes = std::fs::read(dir.path().join(FILE_NAME)).unwrap();
            assert_eq!(lsns(&read(&bytes, 7, checkpoint)), (synced.clone(), 0), "{cycle}");
        }
        // Appended, never synced: not in the file.
        log.append(&log.writer(), &ops_of(&[("t", b"unsynced", Some(b"v"))]));
        let bytes = std::fs::read(dir.path().join(FILE_NAME)).unwrap();
        assert_eq!(lsns(&read(&bytes, 7, checkpoint)), (synced, 0), "{cycle}");
        // A checkpoint covers them all (the unsynced record included): nothing after.
        let w = log.writer();
        checkpoint = log.last(&w);
        log.emptied(&w).unwrap();
        drop(w);
        let bytes = std::fs::read(dir.path().join(FILE_NAME)).unwrap();
        assert_eq!(lsns(&read(&bytes, 7, checkpoint)), (vec![], 0), "{cycle}");
    }
}

/// Syncs within what the file holds change neither its length nor its blocks (so
/// `fdatasync` writes no metadata); one past it grows it ahead; a checkpoint after a
/// burst shrinks it to KEEP.
#[test]
fn the_file_is_grown_ahead_and_shrunk_after_a_burst() {
    let dir = tempfile::tempdir().unwrap();
    let log = RedoLog::create(dir.path(), 7).unwrap();
    let created = size(dir.path());
    assert_eq!(created, (GROW_AT_LEAST, GROW_AT_LEAST), "zero-filled ahead at its creation");
    for _ in 0..50 {
        log.append(&log.writer(), &ops_of(&[("t", b"k", Some(&[1; 1000]))]));
        log.sync().unwrap();
    }
    assert_eq!(size(dir.path()), created, "50 KiB of records in the first MiB");
    // A burst past KEEP: the file grows ahead of it, in steps.
    let burst = vec![2u8; 1 << 20];
    for _ in 0..(KEEP >> 20) + 2 {
        log.append(&log.writer(), &ops_of(&[("t", b"k", Some(&burst))]));
        log.sync().unwrap();
        let (len, _) = size(dir.path());
        assert!(len >= log.written_len() as u64 && len % GROW_AT_LEAST == 0, "{len}");
    }
    assert!(size(dir.path()).0 > KEEP);
    log.emptied(&log.writer()).unwrap();
    assert_eq!(size(dir.path()).0, KEEP, "shrunk at the checkpoint");
    // The next cycle overwrites: the size stays.
    log.append(&log.writer(), &ops_of(&[("t", b"k", Some(&[3; 1000]))]));
    log.sync().unwrap();
    assert_eq!(size(dir.path()).0, KEEP);
}
