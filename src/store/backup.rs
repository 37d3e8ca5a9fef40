//! The backup file of an embedded store: every entry of every tree, as one consistent
//! snapshot, in a format of its own (not an engine's file: a backup of a redb store
//! restores onto sled and back), ended by a SHA-256 of all that precedes it.
//!
//! ```text
//! HOOKRELAY-BACKUP 1\n
//! {"schema": 2, "engine": "redb", "created_at_us": …, "trees": ["meta", …]}\n
//! entry*: 0x01, tree index (u16), key length (u32), key, value length (u32), value
//! end:    0x00, entries (u64), then the SHA-256 of every byte before it (32 bytes)
//! ```
//!
//! Integers are big-endian. A file cut short, flipped or spliced fails its check: a
//! reader never hands on an entry of a file it has not checked whole (`verify`, then
//! `entries`).

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The first line of every backup.
const MAGIC: &[u8] = b"HOOKRELAY-BACKUP 1\n";
/// A header line longer than this is not a backup's.
const MAX_HEADER: usize = 64 * 1024;
/// No key or value of the store comes near this: a length past it is corruption.
const MAX_ITEM: u32 = 1 << 30;

/// What a backup says of itself (its header line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Header {
    /// The store's layout version: a restore needs its own build's.
    pub(crate) schema: u32,
    /// The engine it was taken from (it restores onto either).
    pub(crate) engine: String,
    pub(crate) created_at_us: u64,
    /// The trees, by index in the entries.
    pub(crate) trees: Vec<String>,
}

/// A backup checked whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Summary {
    pub(crate) header: Header,
    pub(crate) entries: u64,
    /// Bytes of keys and values.
    pub(crate) bytes: u64,
    /// The SHA-256 the file ends with (hex).
    pub(crate) sha256: String,
}

/// Why a file is not a sound backup.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BackupError {
    #[error("reading the backup: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a hookrelay backup (it does not start with HOOKRELAY-BACKUP 1)")]
    NotABackup,
    #[error("the backup's header is unreadable: {0}")]
    Header(String),
    #[error("the backup is damaged: {0}; take another")]
    Damaged(String),
    #[error(
        "the backup's checksum does not match its content (it ends in {expected}, its bytes \
         hash to {actual}): it is damaged or was cut; take another"
    )]
    Checksum { expected: String, actual: String },
}

/// Writes a backup to `out`, hashing as it goes.
pub(crate) struct Writer<W: Write> {
    out: W,
    hash: Sha256,
    entries: u64,
    bytes: u64,
}

impl<W: Write> Writer<W> {
    /// Starts a backup with `header`.
    pub(crate) fn start(out: W, header: &Header) -> std::io::Result<Self> {
        let mut w = Self { out, hash: Sha256::new(), entries: 0, bytes: 0 };
        w.put(MAGIC)?;
        let mut line = serde_json::to_vec(header).map_err(std::io::Error::other)?;
        line.push(b'\n');
        w.put(&line)?;
        Ok(w)
    }

    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.hash.update(bytes);
        self.out.write_all(bytes)
    }

    /// One entry of the tree at `tree` (its index in the header).
    pub(crate) fn entry(&mut self, tree: u16, key: &[u8], value: &[u8]) -> std::io::Result<()> {
        let len = |b: &[u8]| u32::try_from(b.len()).map_err(std::io::Error::other);
        let mut head = [0u8; 7];
        head[0] = 1;
        head[1..3].copy_from_slice(&tree.to_be_bytes());
        head[3..7].copy_from_slice(&len(key)?.to_be_bytes());
        self.put(&head)?;
        self.put(key)?;
        self.put(&len(value)?.to_be_bytes())?;
        self.put(value)?;
        self.entries += 1;
        self.bytes += (key.len() + value.len()) as u64;
        Ok(())
    }

    /// Ends it: the count and the checksum; returns (entries, bytes, SHA-256 hex).
    pub(crate) fn finish(mut self) -> std::io::Result<(u64, u64, String)> {
        let mut end = [0u8; 9];
        end[1..9].copy_from_slice(&self.entries.to_be_bytes());
        self.put(&end)?;
        let digest = self.hash.finalize();
        self.out.write_all(&digest)?;
        self.out.flush()?;
        Ok((self.entries, self.bytes, hex(&digest)))
    }
}

/// Reads a backup through, handing each entry to `visit` (tree name, key, value), and
/// checks its end and checksum. `visit` may see entries of a file that then fails its
/// check: read it once with `|_, _, _| Ok(())` first ([`verify`]) when that matters.
pub(crate) fn read(
    input: impl Read,
    mut visit: impl FnMut(&str, &[u8], &[u8]) -> Result<(), BackupError>,
) -> Result<Summary, BackupError> {
    let mut r =
        Hashing { inner: std::io::BufReader::with_capacity(1 << 16, input), hash: Sha256::new() };
    let mut magic = vec![0u8; MAGIC.len()];
    r.exact(&mut magic).map_err(|_| BackupError::NotABackup)?;
    if magic != MAGIC {
        return Err(BackupError::NotABackup);
    }
    let header = read_header(&mut r)?;
    let (mut entries, mut bytes) = (0u64, 0u64);
    loop {
        let mut kind = [0u8; 1];
        r.exact(&mut kind).map_err(cut)?;
        match kind[0] {
            1 => {
                let mut head = [0u8; 6];
                r.exact(&mut head).map_err(cut)?;
                let tree = usize::from(u16::from_be_bytes([head[0], head[1]]));
                let name = header.trees.get(tree).ok_or_else(|| {
                    BackupError::Damaged(format!(
                        "entry {entries} names tree {tree}, which the header does not list"
                    ))
                })?;
                let key = r.item(u32::from_be_bytes([head[2], head[3], head[4], head[5]]))?;
                let mut len = [0u8; 4];
                r.exact(&mut len).map_err(cut)?;
                let value = r.item(u32::from_be_bytes(len))?;
                visit(name, &key, &value)?;
                entries += 1;
                bytes += (key.len() + value.len()) as u64;
            }
            0 => break,
            other => return Err(BackupError::Damaged(format!("an entry of unknown kind {other}"))),
        }
    }
    let mut count = [0u8; 8];
    r.exact(&mut count).map_err(cut)?;
    let actual = r.hash.clone().finalize();
    let mut expected = [0u8; 32];
    r.inner.read_exact(&mut expected).map_err(cut)?;
    if expected[..] != actual[..] {
        return Err(BackupError::Checksum { expected: hex(&expected), actual: hex(&actual) });
    }
    if u64::from_be_bytes(count) != entries {
        return Err(BackupError::Damaged(format!(
            "it says it holds {} entries and holds {entries}",
            u64::from_be_bytes(count)
        )));
    }
    let mut rest = [0u8; 1];
    if r.inner.read(&mut rest)? != 0 {
        return Err(BackupError::Damaged("bytes follow its end".into()));
    }
    Ok(Summary { header, entries, bytes, sha256: hex(&expected) })
}

/// Checks a backup whole: its structure, its count and its checksum.
pub(crate) fn verify(input: impl Read) -> Result<Summary, BackupError> {
    read(input, |_, _, _| Ok(()))
}

/// The header line, after the magic.
fn read_header<R: Read>(r: &mut Hashing<R>) -> Result<Header, BackupError> {
    let mut line = Vec::new();
    loop {
        let mut b = [0u8; 1];
        r.exact(&mut b).map_err(cut)?;
        if b[0] == b'\n' {
            break;
        }
        line.push(b[0]);
        if line.len() > MAX_HEADER {
            return Err(BackupError::Header("longer than 64 KiB".into()));
        }
    }
    serde_json::from_slice(&line).map_err(|e| BackupError::Header(e.to_string()))
}

/// A file that ends early.
fn cut(e: std::io::Error) -> BackupError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        BackupError::Damaged("it ends early (cut short?)".into())
    } else {
        BackupError::Io(e)
    }
}

/// A reader that hashes what it reads.
struct Hashing<R: Read> {
    inner: std::io::BufReader<R>,
    hash: Sha256,
}

impl<R: Read> Hashing<R> {
    fn exact(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_exact(buf)?;
        self.hash.update(&*buf);
        Ok(())
    }

    /// A key or a value of `len` bytes.
    fn item(&mut self, len: u32) -> Result<Vec<u8>, BackupError> {
        if len > MAX_ITEM {
            return Err(BackupError::Damaged(format!("an item of {len} bytes")));
        }
        let mut item = vec![0u8; len as usize];
        self.exact(&mut item).map_err(cut)?;
        Ok(item)
    }
}

/// Lowercase hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header() -> Header {
        Header {
            schema: 2,
            engine: "redb".into(),
            created_at_us: 7,
            trees: vec!["a".into(), "b".into()],
        }
    }

    fn backup(entries: &[(u16, Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut w = Writer::start(&mut out, &header()).unwrap();
        for (t, k, v) in entries {
            w.entry(*t, k, v).unwrap();
        }
        let (n, _, sum) = w.finish().unwrap();
        assert_eq!(n as usize, entries.len());
        assert_eq!(sum.len(), 64);
        out
    }

    proptest! {
        #[test]
        fn what_is_written_reads_back_and_any_change_is_caught(
            entries in prop::collection::vec((0u16..2, prop::collection::vec(any::<u8>(), 0..40), prop::collection::vec(any::<u8>(), 0..200)), 0..30),
            at in any::<prop::sample::Index>(),
            flip in 1u8..=255,
        ) {
            let file = backup(&entries);
            let mut back = Vec::new();
            let summary = read(file.as_slice(), |t, k, v| {
                back.push((if t == "a" { 0u16 } else { 1 }, k.to_vec(), v.to_vec()));
                Ok(())
            }).unwrap();
            prop_assert_eq!(&back, &entries);
            prop_assert_eq!(summary.entries as usize, entries.len());
            prop_assert_eq!(summary.header, header());
            // One byte changed anywhere: refused.
            let mut bad = file.clone();
            let i = at.index(bad.len());
            bad[i] ^= flip;
            prop_assert!(verify(bad.as_slice()).is_err());
            // Cut anywhere: refused.
            let cut_at = at.index(file.len());
            prop_assert!(verify(&file[..cut_at]).is_err());
        }
    }

    #[test]
    fn a_file_that_is_not_a_backup_or_has_more_after_its_end_is_refused_with_why() {
        assert!(matches!(verify(&b"hello"[..]), Err(BackupError::NotABackup)));
        let mut file = backup(&[(0, b"k".to_vec(), b"v".to_vec())]);
        file.push(0);
        assert!(verify(file.as_slice()).unwrap_err().to_string().contains("bytes follow"));
    }
}
