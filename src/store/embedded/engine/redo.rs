//! The redo log in front of redb (`{data_dir}/redo.log`): every committed write
//! transaction appended to it, in commit order, so that a write is made durable by one
//! append and one `fdatasync` of the log (shared by the writers waiting, `../flush.rs`)
//! instead of a durable redb commit (two fsyncs, and redb's allocator state saved:
//! 39% of a callback's CPU at 200/s, BENCHMARKS.md "Where the CPU goes").
//!
//! Invariants, which `redb_kv.rs` keeps and the tests below and in `tests.rs` check:
//! 1. A record is appended only after its transaction committed, by the writer that
//!    holds [`RedoLog::writer`] from the transaction's start: the log's order is the
//!    commit order, and the log holds nothing that did not commit.
//! 2. Records are numbered (their LSN) from 1 without a gap. A **checkpoint** is a
//!    durable redb commit that writes the log's id and the last LSN it covers into the
//!    `redo` table, under the writer lock; only then is the log emptied
//!    ([`RedoLog::emptied`]). Every durable redb commit is a checkpoint (the last
//!    handle checkpoints before redb's close, which would make pending commits durable
//!    on its own): the durable file never holds a write newer than its checkpoint's
//!    record, so the records after it, applied again, end in the state they made.
//! 3. At open, the records of a log whose id is the checkpoint's, numbered after the
//!    checkpoint's LSN, are applied again in order, up to the first that is torn (its
//!    length, checksum or number wrong): what was never synced was never acknowledged.
//!    Then a checkpoint, and a new log with a new id: a log another store left (a
//!    restore, a copy moved in) never carries the id and is never applied.
//! 4. The file is **recycled**, never truncated to its header: after a checkpoint the
//!    next records overwrite the old ones from the start, and the file is kept
//!    zero-filled ahead of its last record ([`GROW_AT_LEAST`] at a time, synced with its
//!    new size once). A sync then overwrites blocks the file already has, at a size
//!    that does not change, so its `fdatasync` writes the data alone: no inode, no
//!    block allocation (on ext4 without a journal an appending sync waited for three
//!    writes, one of them the inode; an overwriting one for two; BENCHMARKS.md,
//!    "The redo log recycled"). What the new records did not overwrite is zeros
//!    (never a record) or records of earlier cycles, all numbered at or before the
//!    checkpoint that ended their cycle, so never the next number of this one: the
//!    read stops there as at a torn record. The file shrinks back to [`KEEP`] at a
//!    checkpoint when a burst grew it past that.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use crate::lock::lock;

/// The log's file in `storage.data_dir`.
pub(crate) const FILE_NAME: &str = "redo.log";
/// What a log file starts with, before its id.
const MAGIC: &[u8; 8] = b"HKRREDO1";
/// The header: the magic and the id (u64, little-endian).
const HEADER: usize = 16;
/// A record's head: payload length (u32), CRC-32 of the LSN and payload (u32), LSN (u64).
const RECORD_HEAD: usize = 16;
const INSERT: u8 = 1;
const REMOVE: u8 = 2;
/// The log's file is zero-filled ahead by at least this (and at most by what it holds
/// already, doubling), when a sync would write past what it has: a new store's log
/// starts with it too (invariant 4).
pub(super) const GROW_AT_LEAST: u64 = 1 << 20;
/// What a checkpoint leaves of a file a burst grew larger: enough for the seconds
/// between two checkpoints at a steady rate, not a burst's hundreds of MiB kept for good.
pub(super) const KEEP: u64 = 16 << 20;

/// The writes of one transaction, encoded as they are made (one allocation grows).
#[derive(Default)]
pub(super) struct Ops(Vec<u8>);

impl Ops {
    fn head(&mut self, kind: u8, table: &str, key: &[u8]) {
        // Table names are the store's own short constants; keys are ids and hashes.
        let name = table.as_bytes();
        self.0.push(kind);
        self.0.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
        self.0.extend_from_slice(&name[..name.len().min(255)]);
        self.0.extend_from_slice(&len32(key.len()).to_le_bytes());
        self.0.extend_from_slice(key);
    }

    pub(super) fn insert(&mut self, table: &str, key: &[u8], value: &[u8]) {
        self.head(INSERT, table, key);
        self.0.extend_from_slice(&len32(value.len()).to_le_bytes());
        self.0.extend_from_slice(value);
    }

    pub(super) fn remove(&mut self, table: &str, key: &[u8]) {
        self.head(REMOVE, table, key);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Appends `other`'s writes after these (a transaction over several tables).
    pub(super) fn extend(&mut self, other: &Ops) {
        self.0.extend_from_slice(&other.0);
    }
}

/// A length as the log stores it. Keys and values over 4 GiB do not reach the store
/// (the ingress caps bodies far below).
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// One write read back from a record.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Op<'a> {
    Insert { table: &'a str, key: &'a [u8], value: &'a [u8] },
    Remove { table: &'a str, key: &'a [u8] },
}

/// The writes of a record's payload, in order; `Err` names what is wrong (a record
/// whose checksum held but does not parse is a bug, never a torn write).
pub(super) fn ops(mut payload: &[u8]) -> Result<Vec<Op<'_>>, String> {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
        if bytes.len() < n {
            return Err(format!("{n} bytes wanted, {} left", bytes.len()));
        }
        let (head, rest) = bytes.split_at(n);
        *bytes = rest;
        Ok(head)
    }
    fn take_len(bytes: &mut &[u8]) -> Result<usize, String> {
        let raw = take(bytes, 4)?;
        Ok(u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]) as usize)
    }
    let mut out = Vec::new();
    while !payload.is_empty() {
        let kind = take(&mut payload, 1)?[0];
        let name_len = take(&mut payload, 1)?[0] as usize;
        let table = std::str::from_utf8(take(&mut payload, name_len)?)
            .map_err(|e| format!("a table name that is not UTF-8: {e}"))?;
        let key_len = take_len(&mut payload)?;
        let key = take(&mut payload, key_len)?;
        out.push(match kind {
            INSERT => {
                let value_len = take_len(&mut payload)?;
                Op::Insert { table, key, value: take(&mut payload, value_len)? }
            }
            REMOVE => Op::Remove { table, key },
            other => return Err(format!("unknown write kind {other}")),
        });
    }
    Ok(out)
}

/// A record read back: its number and its writes, still encoded.
#[derive(Debug)]
pub(super) struct Record<'a> {
    pub(super) lsn: u64,
    pub(super) payload: &'a [u8],
}

/// What a log file holds for the store whose checkpoint is `(id, after)`.
#[derive(Debug)]
pub(super) enum Read<'a> {
    /// Another store's log, or not a log: nothing of it applies.
    Foreign,
    /// The records numbered after `after`, in order; `torn` bytes after the last one
    /// are not a whole record of the sequence (a write the crash cut short).
    Records { records: Vec<Record<'a>>, torn: usize },
}

/// Reads `bytes` (a whole log file) for the store whose checkpoint is `(id, after)`.
pub(super) fn read(bytes: &[u8], id: u64, after: u64) -> Read<'_> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC || bytes[8..16] != id.to_le_bytes() {
        return Read::Foreign;
    }
    let mut records = Vec::new();
    let mut at = HEADER;
    // Records at or before the checkpoint may still be there (the log is emptied after
    // the checkpoint's commit): skipped, but they must still be a numbered sequence.
    let mut expect: Option<u64> = None;
    while bytes.len() - at >= RECORD_HEAD {
        let head = &bytes[at..at + RECORD_HEAD];
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        let lsn_bytes = &head[8..16];
        let lsn = u64::from_le_bytes(lsn_bytes.try_into().unwrap_or_default());
        let Some(payload) = bytes.get(at + RECORD_HEAD..at + RECORD_HEAD + len) else { break };
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(lsn_bytes);
        hasher.update(payload);
        if hasher.finalize() != crc || expect.is_some_and(|e| e != lsn) || lsn == 0 {
            break;
        }
        if lsn > after {
            // The first record kept must follow the checkpoint: a gap means the
            // records between were lost, and nothing after them may be applied.
            if records.is_empty() && lsn != after + 1 {
                break;
            }
            records.push(Record { lsn, payload });
        }
        expect = Some(lsn + 1);
        at += RECORD_HEAD + len;
    }
    Read::Records { records, torn: torn(&bytes[at..], expect.unwrap_or(after + 1)) }
}

/// The bytes of a record numbered `next` that `rest` (where the read stopped) begins
/// with but does not hold whole: a write the stop cut short. Zeros ahead of the log's
/// end and an earlier cycle's records (invariant 4) are no torn write: 0.
fn torn(rest: &[u8], next: u64) -> usize {
    if rest.len() < RECORD_HEAD {
        // Too short to tell its number: torn if anything was written there.
        return if rest.iter().any(|b| *b != 0) { rest.len() } else { 0 };
    }
    let lsn = u64::from_le_bytes(rest[8..16].try_into().unwrap_or_default());
    if lsn != next {
        return 0;
    }
    let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
    rest.len().min(RECORD_HEAD.saturating_add(len))
}

/// The writes appended since the last sync, the last LSN handed out, and how many
/// bytes of records were appended since the last checkpoint.
#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    last: u64,
    since_checkpoint: usize,
}

/// The open log's file, where the next write goes, and how far the file is written
/// (zeros or an earlier cycle's records past `len`: invariant 4).
struct Tail {
    file: File,
    len: u64,
    allocated: u64,
}

impl Tail {
    /// Makes the file hold at least `end` bytes, zero-filled past what it held and
    /// synced with its new size, so that the syncs of the records written there change
    /// no metadata. Best effort: on an error (a full disk) the file stays as it was,
    /// and the records are appended past its end as they would be without this.
    fn reserve(&mut self, end: u64) {
        if end <= self.allocated {
            return;
        }
        // Doubling from GROW_AT_LEAST, by 64 MiB at most a step.
        let ahead = self.allocated.clamp(GROW_AT_LEAST, 64 << 20);
        let grown = end.max(self.allocated.saturating_add(ahead)).next_multiple_of(GROW_AT_LEAST);
        match zero_fill(&self.file, self.allocated, grown) {
            Ok(()) => self.allocated = grown,
            Err(e) => {
                tracing::debug!(error = %e, "the redo log could not grow ahead; appending");
                // Some zeros may be written: harmless past the last record (never read
                // as one), and overwritten by the next records.
            }
        }
    }
}

/// Writes zeros over `from..to` of `file` and syncs it, its size included.
fn zero_fill(file: &File, from: u64, to: u64) -> io::Result<()> {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64) as usize;
        file.write_all_at(&ZEROS[..n], at)?;
        at += n as u64;
    }
    file.sync_all()
}

/// The log a [`super::redb_kv::RedbDb`] writes (see the module docs).
pub(super) struct RedoLog {
    /// Held by a writer from its transaction's start to its record's append, and by a
    /// checkpoint (invariants 1 and 2).
    writer: Mutex<()>,
    /// Lock order: `writer`, then `tail`, then `pending`.
    tail: Mutex<Tail>,
    pending: Mutex<Pending>,
    id: u64,
}

/// Proof that the caller holds the writer lock.
pub(super) type Writer<'a> = MutexGuard<'a, ()>;

impl RedoLog {
    /// A new, empty log with `id` in `dir`, replacing the file there once it is
    /// durable (written beside, synced, renamed, the directory synced), its next
    /// record numbered 1.
    pub(super) fn create(dir: &Path, id: u64) -> io::Result<Self> {
        let path = dir.join(FILE_NAME);
        let beside = dir.join(format!(".{FILE_NAME}.new"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&beside)?;
        let mut header = [0u8; HEADER];
        header[..8].copy_from_slice(MAGIC);
        header[8..].copy_from_slice(&id.to_le_bytes());
        file.write_all_at(&header, 0)?;
        // Zero-filled ahead from the start, best effort (invariant 4).
        let allocated = match zero_fill(&file, HEADER as u64, GROW_AT_LEAST) {
            Ok(()) => GROW_AT_LEAST,
            Err(_) => HEADER as u64,
        };
        file.sync_all()?;
        let tail = Tail { file, len: HEADER as u64, allocated };
        std::fs::rename(&beside, &path)?;
        File::open(dir)?.sync_all()?;
        Ok(Self {
            writer: Mutex::new(()),
            tail: Mutex::new(tail),
            pending: Mutex::new(Pending::default()),
            id,
        })
    }

    pub(super) fn id(&self) -> u64 {
        self.id
    }

    /// Taken before a write transaction begins and held until its record is appended.
    pub(super) fn writer(&self) -> Writer<'_> {
        lock(&self.writer)
    }

    /// Appends a committed transaction's writes (invariant 1: the caller holds the
    /// writer lock it took before the transaction began). In memory until
    /// [`RedoLog::sync`].
    pub(super) fn append(&self, _writer: &Writer<'_>, ops: &Ops) {
        let mut p = lock(&self.pending);
        p.last += 1;
        let lsn = p.last.to_le_bytes();
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&lsn);
        hasher.update(&ops.0);
        p.bytes.extend_from_slice(&len32(ops.0.len()).to_le_bytes());
        p.bytes.extend_from_slice(&hasher.finalize().to_le_bytes());
        p.bytes.extend_from_slice(&lsn);
        p.bytes.extend_from_slice(&ops.0);
        p.since_checkpoint += RECORD_HEAD + ops.0.len();
    }

    /// Bytes of records appended since the last checkpoint: what the next one writes
    /// is about proportional to it, and so is how long writers wait for it.
    pub(super) fn since_checkpoint(&self) -> usize {
        lock(&self.pending).since_checkpoint
    }

    /// The last LSN handed out: a checkpoint taken now covers every record up to it.
    pub(super) fn last(&self, _writer: &Writer<'_>) -> u64 {
        lock(&self.pending).last
    }

    /// Makes every record appended so far durable: written at the log's end and
    /// `fdatasync`ed. A failure puts the bytes back, to be written at the same place
    /// by the next sync (nothing after a torn record is ever read).
    pub(super) fn sync(&self) -> io::Result<()> {
        let mut tail = lock(&self.tail);
        let bytes = std::mem::take(&mut lock(&self.pending).bytes);
        if bytes.is_empty() {
            // Every record so far is written and synced, or covered by a checkpoint.
            return Ok(());
        }
        let end = tail.len + bytes.len() as u64;
        tail.reserve(end);
        let written = tail.file.write_all_at(&bytes, tail.len).and_then(|()| tail.file.sync_data());
        match written {
            Ok(()) => {
                tail.len = end;
                tail.allocated = tail.allocated.max(end);
                Ok(())
            }
            Err(e) => {
                let mut p = lock(&self.pending);
                let later = std::mem::replace(&mut p.bytes, bytes);
                p.bytes.extend_from_slice(&later);
                Err(e)
            }
        }
    }

    /// After a checkpoint (invariant 2: under the writer lock, every record is covered
    /// by it): the log emptied, its next records written from the start over the old
    /// ones (invariant 4), and the file shrunk to [`KEEP`] if a burst grew it past
    /// that. If the shrinking fails, the file stays larger: nothing else changes.
    pub(super) fn emptied(&self, _writer: &Writer<'_>) -> io::Result<()> {
        let mut tail = lock(&self.tail);
        {
            let mut p = lock(&self.pending);
            p.bytes.clear();
            p.since_checkpoint = 0;
        }
        tail.len = HEADER as u64;
        if tail.allocated > KEEP {
            tail.file.set_len(KEEP)?;
            tail.allocated = KEEP;
        }
        Ok(())
    }

    /// How far the records go: the file's bytes past this are zeros or an earlier
    /// cycle's (invariant 4).
    #[cfg(test)]
    fn written_len(&self) -> usize {
        lock(&self.tail).len as usize
    }

    /// The bytes the log's file takes on disk (its allocated blocks).
    pub(super) fn size_on_disk(&self) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        Ok(lock(&self.tail).file.metadata()?.blocks().saturating_mul(512))
    }
}

#[cfg(test)]
mod tests {
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
}
