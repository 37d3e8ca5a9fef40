//! The reads the lifecycle rules ask for, answered from the trees (under the
//! lifecycle lock, so nothing moves between the read and the write).

use super::{deliveries::decode_record, keys, EmbeddedState};
use crate::store::lifecycle::{DedupEntry, Queue, View};
use crate::store::{DeliveryRecord, EventId, EventMeta, StoreError};

impl View for EmbeddedState {
    fn dedup(&self, hash: &[u8; 16]) -> Result<Option<DedupEntry>, StoreError> {
        self.dedup_entry(hash)
    }

    fn delivery(&self, event: EventId, dest: &str) -> Result<Option<DeliveryRecord>, StoreError> {
        let key = keys::delivery(event, dest);
        self.deliveries.get(&key)?.map(|v| decode_record(&key, &v)).transpose()
    }

    fn queue(&self, dest: &str, resource: &[u8; 16]) -> Result<Option<Queue>, StoreError> {
        Ok(self.ordering.get(keys::order(dest, resource))?.and_then(|v| keys::decode_order(&v)))
    }

    fn claimed(&self, event: EventId, dest: &str, now_us: u64) -> Result<bool, StoreError> {
        Ok(self.claims.is_claimed(dest, event, now_us))
    }

    fn event(&self, id: EventId) -> Result<Option<EventMeta>, StoreError> {
        let key = id.to_key();
        Ok(self.records.get(key)?.map(|v| self.decode(&key, &v)).transpose()?.map(|r| r.meta))
    }

    fn deliveries_of(&self, event: EventId) -> Result<Vec<DeliveryRecord>, StoreError> {
        EmbeddedState::deliveries_of(self, event)
    }
}
