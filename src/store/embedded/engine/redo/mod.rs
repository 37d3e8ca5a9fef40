//! The redo log in front of redb (`{data_dir}/redo.log`): every committed write
//! transaction appended to it, in commit order, so that a write is made durable by one
//! append and one `fdatasync` of the log (shared by the writers waiting, `embedded/flush.rs`)
//! instead of a durable redb commit (two fsyncs, and redb's allocator state saved:
//! 39% of a callback's CPU at 200/s, BENCHMARKS.md "Where the CPU goes").
//!
//! Invariants, which `redb_kv.rs` keeps and `tests.rs` here and `engine/tests.rs` check:
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

mod format;
#[cfg(test)]
mod tests;

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use crate::lock::lock;
use format::{len32, HEADER, MAGIC, RECORD_HEAD};
pub(super) use format::{ops, read, Op, Ops, Read, Record};

/// The log's file in `storage.data_dir`.
pub(crate) const FILE_NAME: &str = "redo.log";
/// The log's file is zero-filled ahead by at least this (and at most by what it holds
/// already, doubling), when a sync would write past what it has: a new store's log
/// starts with it too (invariant 4).
pub(super) const GROW_AT_LEAST: u64 = 1 << 20;
/// What a checkpoint leaves of a file a burst grew larger: enough for the seconds
/// between two checkpoints at a steady rate, not a burst's hundreds of MiB kept for good.
pub(super) const KEEP: u64 = 16 << 20;

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
        // Zero-filled ahead from the start, best effort (invariant 4); synced with the
        // header by the fill, or on its own when the fill failed.
        let allocated = match zero_fill(&file, HEADER as u64, GROW_AT_LEAST) {
            Ok(()) => GROW_AT_LEAST,
            Err(_) => {
                file.sync_all()?;
                HEADER as u64
            }
        };
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
