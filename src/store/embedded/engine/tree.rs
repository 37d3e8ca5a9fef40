//! [`Tree`]'s and [`TxTree`]'s operations: ordered bytes to bytes, outside a
//! transaction and inside one, each a match over the two engines.

use std::ops::{Bound, RangeBounds};

use super::*;

impl Tree {
    pub(crate) fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Bytes>, StoreError> {
        match self {
            Tree::Sled(t) => t.get(key.as_ref()),
            Tree::Redb(t) => t.get(key.as_ref()),
        }
    }

    pub(crate) fn contains_key(&self, key: impl AsRef<[u8]>) -> Result<bool, StoreError> {
        match self {
            Tree::Sled(t) => t.contains_key(key.as_ref()),
            Tree::Redb(t) => t.contains_key(key.as_ref()),
        }
    }

    /// Sets `key` to `value`; returns what it held.
    pub(crate) fn insert(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<Option<Bytes>, StoreError> {
        match self {
            Tree::Sled(t) => t.insert(key.as_ref(), value.as_ref()),
            Tree::Redb(t) => t.insert(key.as_ref(), value.as_ref()),
        }
    }

    /// Removes `key`; returns what it held.
    pub(crate) fn remove(&self, key: impl AsRef<[u8]>) -> Result<Option<Bytes>, StoreError> {
        match self {
            Tree::Sled(t) => t.remove(key.as_ref()),
            Tree::Redb(t) => t.remove(key.as_ref()),
        }
    }

    /// Applies every write of `batch`, all or none.
    pub(crate) fn apply_batch(&self, batch: Batch) -> Result<(), StoreError> {
        match self {
            Tree::Sled(t) => t.apply_batch(batch.ops),
            Tree::Redb(t) => t.apply_batch(batch.ops),
        }
    }

    /// Replaces the values of `batch`'s keys with smaller ones, all or none, so that
    /// the space they gave up is freed. redb keeps a B-tree page whose values shrank
    /// as large as it was (a leaf is only merged with its neighbours when it loses
    /// keys): the keys are removed first, which frees the leaves they emptied, then
    /// written again, packed into as few pages as their new size needs. sled logs
    /// the new values and reclaims the old ones as it compacts its log.
    pub(crate) fn apply_shrinking(&self, batch: Batch) -> Result<(), StoreError> {
        match self {
            Tree::Sled(_) => self.apply_batch(batch),
            Tree::Redb(t) => t.apply_shrinking(batch.ops),
        }
    }

    /// The entries with keys in `range`.
    pub(crate) fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Iter {
        let bound = |b: Bound<&K>| match b {
            Bound::Included(k) => Bound::Included(k.as_ref().to_vec()),
            Bound::Excluded(k) => Bound::Excluded(k.as_ref().to_vec()),
            Bound::Unbounded => Bound::Unbounded,
        };
        let range = (bound(range.start_bound()), bound(range.end_bound()));
        match self {
            Tree::Sled(t) => t.range(range),
            Tree::Redb(t) => t.range(range),
        }
    }

    /// Every entry.
    pub(crate) fn iter(&self) -> Iter {
        self.range::<&[u8], _>(..)
    }

    /// The entries whose keys start with `prefix`.
    pub(crate) fn scan_prefix(&self, prefix: impl AsRef<[u8]>) -> Iter {
        let prefix = prefix.as_ref();
        match successor(prefix) {
            Some(end) => self.range(prefix.to_vec()..end),
            None => self.range(prefix.to_vec()..),
        }
    }

    /// The entry with the largest key.
    pub(crate) fn last(&self) -> Result<Option<(Bytes, Bytes)>, StoreError> {
        self.iter().next_back().transpose()
    }

    /// How many entries: sled walks the tree, redb keeps the count.
    pub(crate) fn len(&self) -> Result<u64, StoreError> {
        match self {
            Tree::Sled(t) => Ok(t.len()),
            Tree::Redb(t) => t.len(),
        }
    }
}

impl TxTree<'_> {
    pub(crate) fn get(&self, key: impl AsRef<[u8]>) -> TxResult<Option<Bytes>> {
        match self {
            TxTree::Sled(t) => t.get(key.as_ref()),
            TxTree::Redb(t) => redb_kv::tx_get(&t.borrow(), key.as_ref()),
        }
    }

    pub(crate) fn insert(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> TxResult<Option<Bytes>> {
        match self {
            TxTree::Sled(t) => t.insert(key.as_ref(), value.as_ref()),
            TxTree::Redb(t) => {
                redb_kv::tx_insert(&mut t.borrow_mut(), key.as_ref(), value.as_ref())
            }
        }
    }

    pub(crate) fn remove(&self, key: impl AsRef<[u8]>) -> TxResult<Option<Bytes>> {
        match self {
            TxTree::Sled(t) => t.remove(key.as_ref()),
            TxTree::Redb(t) => redb_kv::tx_remove(&mut t.borrow_mut(), key.as_ref()),
        }
    }
}

/// The smallest key greater than every key starting with `prefix`, if there is one
/// (none when the prefix is empty or all `0xff`).
pub(super) fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}
