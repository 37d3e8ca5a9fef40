//! A table of a [`RedbDb`](super::RedbDb) read and written outside a transaction
//! (each write its own non-durable commit, logged for the redo log), and a table
//! inside one (`tx_*`).

use std::ops::Bound;

use redb::{Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata};

use super::{abort, err, reads, RedbTree, TxTable};
use crate::store::embedded::engine::redo::Ops;
use crate::store::embedded::engine::{Bytes, Iter, TxResult};
use crate::store::StoreError;

impl RedbTree {
    /// Calls `f` with this table as last committed (shared within a read scope).
    fn with_table<T>(
        &self,
        f: impl FnOnce(
            &redb::ReadOnlyTable<&'static [u8], &'static [u8]>,
        ) -> Result<T, redb::StorageError>,
    ) -> Result<T, StoreError> {
        reads::with_table(self, f)
    }

    /// This table as last committed, in a read transaction of its own.
    pub(super) fn read(
        &self,
    ) -> Result<redb::ReadOnlyTable<&'static [u8], &'static [u8]>, StoreError> {
        self.db.begin_read().map_err(err)?.open_table(self.def).map_err(err)
    }

    /// One non-durable write transaction on this table, its writes appended to the
    /// redo log.
    pub(super) fn write<T>(
        &self,
        f: impl FnOnce(&mut TxTable<'_>) -> Result<T, redb::StorageError>,
    ) -> Result<T, StoreError> {
        let writer = self.db.redo.writer();
        let mut txn = self.db.begin_write().map_err(err)?;
        txn.set_durability(Durability::None).map_err(err)?;
        let (out, ops) = {
            let table = txn.open_table(self.def).map_err(err)?;
            let mut table = TxTable { table, name: self.name, ops: Ops::default() };
            (f(&mut table).map_err(err)?, table.ops)
        };
        self.db.commit(txn, &writer, &ops)?;
        Ok(out)
    }

    pub(crate) fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        self.with_table(|t| Ok(t.get(key)?.map(|v| Bytes::Owned(v.value().to_vec()))))
    }

    /// Whether `key` is there, without copying its value (dispatch asks it per record).
    pub(crate) fn contains_key(&self, key: &[u8]) -> Result<bool, StoreError> {
        self.with_table(|t| Ok(t.get(key)?.is_some()))
    }

    pub(crate) fn insert(&self, key: &[u8], value: &[u8]) -> Result<Option<Bytes>, StoreError> {
        self.write(|t| t.insert(key, value))
    }

    pub(crate) fn remove(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        self.write(|t| t.remove(key))
    }

    pub(crate) fn apply_batch(&self, ops: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), StoreError> {
        self.write(|t| {
            for (k, v) in &ops {
                t.insert(k, v)?;
            }
            Ok(())
        })
    }

    /// Removes every key of `ops`, then writes each with its new value, in one
    /// transaction ([`super::Tree::apply_shrinking`]).
    pub(crate) fn apply_shrinking(&self, ops: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), StoreError> {
        self.write(|t| {
            for (k, _) in &ops {
                t.remove(k)?;
            }
            for (k, v) in &ops {
                t.insert(k, v)?;
            }
            Ok(())
        })
    }

    pub(crate) fn range(&self, (lower, upper): (Bound<Vec<u8>>, Bound<Vec<u8>>)) -> Iter {
        fn borrow(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
            match b {
                Bound::Included(k) => Bound::Included(k.as_slice()),
                Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
                Bound::Unbounded => Bound::Unbounded,
            }
        }
        let scan = self
            .read()
            .and_then(|t| t.range::<&[u8]>((borrow(&lower), borrow(&upper))).map_err(err));
        match scan {
            Ok(scan) => Box::new(scan.map(|item| {
                let (k, v) = item.map_err(err)?;
                Ok((Bytes::Owned(k.value().to_vec()), Bytes::Owned(v.value().to_vec())))
            })),
            Err(e) => Box::new(std::iter::once(Err(e))),
        }
    }

    pub(crate) fn len(&self) -> Result<u64, StoreError> {
        self.with_table(ReadableTableMetadata::len)
    }
}

pub(crate) fn tx_get(t: &TxTable<'_>, key: &[u8]) -> TxResult<Option<Bytes>> {
    Ok(t.table.get(key).map_err(abort)?.map(|v| Bytes::Owned(v.value().to_vec())))
}

pub(crate) fn tx_insert(t: &mut TxTable<'_>, key: &[u8], value: &[u8]) -> TxResult<Option<Bytes>> {
    t.insert(key, value).map_err(abort)
}

pub(crate) fn tx_remove(t: &mut TxTable<'_>, key: &[u8]) -> TxResult<Option<Bytes>> {
    t.remove(key).map_err(abort)
}
