//! The redo log's format: a header (magic and the log's id), then records, each its
//! payload's length, a CRC-32 of its number and payload, its number (the LSN) and the
//! payload: one transaction's writes (`Ops`). How a file is read back for a checkpoint,
//! and what of it is a torn write, is here too; how the file is written, in `mod.rs`.

/// What a log file starts with, before its id.
pub(super) const MAGIC: &[u8; 8] = b"HKRREDO1";
/// The header: the magic and the id (u64, little-endian).
pub(super) const HEADER: usize = 16;
/// A record's head: payload length (u32), CRC-32 of the LSN and payload (u32), LSN (u64).
pub(super) const RECORD_HEAD: usize = 16;
const INSERT: u8 = 1;
const REMOVE: u8 = 2;

/// The writes of one transaction, encoded as they are made (one allocation grows).
#[derive(Default)]
pub(in crate::store::embedded::engine) struct Ops(pub(super) Vec<u8>);

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

    pub(in crate::store::embedded::engine) fn insert(
        &mut self,
        table: &str,
        key: &[u8],
        value: &[u8],
    ) {
        self.head(INSERT, table, key);
        self.0.extend_from_slice(&len32(value.len()).to_le_bytes());
        self.0.extend_from_slice(value);
    }

    pub(in crate::store::embedded::engine) fn remove(&mut self, table: &str, key: &[u8]) {
        self.head(REMOVE, table, key);
    }

    pub(in crate::store::embedded::engine) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Appends `other`'s writes after these (a transaction over several tables).
    pub(in crate::store::embedded::engine) fn extend(&mut self, other: &Ops) {
        self.0.extend_from_slice(&other.0);
    }
}

/// A length as the log stores it. Keys and values over 4 GiB do not reach the store
/// (the ingress caps bodies far below).
pub(super) fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// One write read back from a record.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::store::embedded::engine) enum Op<'a> {
    Insert { table: &'a str, key: &'a [u8], value: &'a [u8] },
    Remove { table: &'a str, key: &'a [u8] },
}

/// The writes of a record's payload, in order; `Err` names what is wrong (a record
/// whose checksum held but does not parse is a bug, never a torn write).
pub(in crate::store::embedded::engine) fn ops(mut payload: &[u8]) -> Result<Vec<Op<'_>>, String> {
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
pub(in crate::store::embedded::engine) struct Record<'a> {
    pub(in crate::store::embedded::engine) lsn: u64,
    pub(in crate::store::embedded::engine) payload: &'a [u8],
}

/// What a log file holds for the store whose checkpoint is `(id, after)`.
#[derive(Debug)]
pub(in crate::store::embedded::engine) enum Read<'a> {
    /// Another store's log, or not a log: nothing of it applies.
    Foreign,
    /// The records numbered after `after`, in order; `torn` bytes after the last one
    /// are not a whole record of the sequence (a write the crash cut short).
    Records { records: Vec<Record<'a>>, torn: usize },
}

/// Reads `bytes` (a whole log file) for the store whose checkpoint is `(id, after)`.
pub(in crate::store::embedded::engine) fn read(bytes: &[u8], id: u64, after: u64) -> Read<'_> {
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
