//! The journal on the embedded store: the `journal` tree, keyed by `(at_us, tie)`
//! big-endian (so the tree's order is the journal's), each value an entry as JSON.

use async_trait::async_trait;

use super::{EmbeddedState, EmbeddedStore, JOURNAL};
use crate::store::{hex, Journal, JournalEntry, JournalFilter, StoreError};

/// Most entries one prune removes (the next pass takes the rest).
const PRUNE_CHUNK: usize = 10_000;

/// The key of the place `(at_us, tie)`.
fn key(at_us: u64, tie: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&at_us.to_be_bytes());
    k[8..].copy_from_slice(&tie.to_be_bytes());
    k
}

/// `entry` as the `journal` tree keeps it: its key and value.
pub(super) fn encoded(entry: &JournalEntry) -> Result<([u8; 16], Vec<u8>), StoreError> {
    Ok((key(entry.at_us, entry.tie), serde_json::to_vec(entry)?))
}

impl EmbeddedState {
    fn journal_append(&self, entry: &JournalEntry) -> Result<(), StoreError> {
        let (key, value) = encoded(entry)?;
        self.journal.insert(key, value)?;
        self.flush_now()
    }

    fn journal_list(&self, filter: &JournalFilter) -> Result<Vec<JournalEntry>, StoreError> {
        let upper = filter.before.map_or([0xff; 16], |(at, tie)| key(at, tie));
        let lower = key(filter.since_us.unwrap_or(0), 0);
        let mut out = Vec::new();
        for item in self.journal.range(lower..upper).rev() {
            let (k, v) = item?;
            let entry: JournalEntry = serde_json::from_slice(&v).map_err(|e| {
                StoreError::Corrupt { table: JOURNAL, key: hex(&k), reason: e.to_string() }
            })?;
            if filter.takes(&entry) {
                out.push(entry);
                if out.len() >= filter.limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    fn journal_prune(&self, before_us: u64) -> Result<usize, StoreError> {
        let old: Vec<_> = self
            .journal
            .range(..key(before_us, 0))
            .take(PRUNE_CHUNK)
            .map(|item| item.map(|(k, _)| k))
            .collect::<Result<_, _>>()?;
        for k in &old {
            self.journal.remove(k)?;
        }
        Ok(old.len())
    }
}

#[async_trait]
impl Journal for EmbeddedStore {
    async fn journal_append(&self, entry: JournalEntry) -> Result<(), StoreError> {
        self.write(move |s| s.journal_append(&entry)).await
    }

    async fn journal_list(&self, filter: JournalFilter) -> Result<Vec<JournalEntry>, StoreError> {
        self.run(move |s| s.journal_list(&filter)).await
    }

    async fn journal_prune(&self, before_us: u64) -> Result<usize, StoreError> {
        self.write(move |s| s.journal_prune(before_us)).await
    }
}
