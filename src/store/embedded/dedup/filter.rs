//! A dedup bucket's membership filter: which hashes the bucket may file, so that a
//! lookup reads only the buckets that may hold its key (`../dedup.rs`).
//!
//! Why: a bucket is narrow (a thirty-second of a window), so that a checkpoint writes
//! the few pages of the bucket being filled rather than a page per key scattered over
//! a window's keys; a window then spans some 33 to 65 buckets, and reading one key in
//! each for every lookup would cost what the narrow buckets save. A filter answers
//! "no" for all but about 1% of the buckets that do not hold the key.
//!
//! A Bloom filter in segments: each segment holds up to its capacity at
//! [`BITS_PER_KEY`] bits a key, and the next one is twice as large, so a bucket's
//! filter grows with its keys whatever the rate, with no count known ahead.
//! Invariant: **no false negative.** A hash inserted is found by every later
//! [`Filter::may_contain`]; nothing is ever removed (a key removed from its bucket
//! stays a false positive until the bucket is forgotten).

/// Bits per key: about a 1% false-positive rate per segment with [`PROBES`] probes.
const BITS_PER_KEY: usize = 10;
/// Probes per key, derived from the hash's two halves (Kirsch-Mitzenmacher).
const PROBES: u64 = 7;
/// The first segment's capacity in keys (1,280 bytes).
const FIRST_KEYS: usize = 1024;

/// A filter's bits in one segment, and how many keys it took.
#[derive(Debug)]
struct Segment {
    bits: Box<[u64]>,
    capacity: usize,
    len: usize,
}

impl Segment {
    fn new(capacity: usize) -> Self {
        Segment { bits: vec![0; words(capacity)].into_boxed_slice(), capacity, len: 0 }
    }

    /// The bits of `hash` (a SHA-256 prefix, so its halves are uniform).
    fn positions(&self, hash: &[u8; 16]) -> impl Iterator<Item = usize> + use<> {
        let half = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
        let (h1, h2) = (half(&hash[..8]), half(&hash[8..]) | 1);
        let m = (self.bits.len() * 64) as u64;
        (0..PROBES).map(move |i| (h1.wrapping_add(i.wrapping_mul(h2)) % m) as usize)
    }

    fn insert(&mut self, hash: &[u8; 16]) {
        for p in self.positions(hash) {
            self.bits[p / 64] |= 1 << (p % 64);
        }
        self.len += 1;
    }

    fn may_contain(&self, hash: &[u8; 16]) -> bool {
        self.positions(hash).all(|p| self.bits[p / 64] & (1 << (p % 64)) != 0)
    }

    fn bytes(&self) -> usize {
        self.bits.len() * 8
    }
}

/// The 64-bit words of a segment of `capacity` keys.
fn words(capacity: usize) -> usize {
    (capacity * BITS_PER_KEY).div_ceil(64)
}

/// A bucket's filter (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Filter {
    segments: Vec<Segment>,
}

impl Filter {
    /// Takes `hash`; returns the bytes the filter grew by (a new segment's), so that
    /// the caller can hold every filter to a budget.
    pub(super) fn insert(&mut self, hash: &[u8; 16]) -> usize {
        let grown = self.next_growth();
        if let Some(capacity) = self.next_segment() {
            self.segments.push(Segment::new(capacity));
        }
        if let Some(last) = self.segments.last_mut() {
            last.insert(hash);
        }
        grown
    }

    /// Whether the bucket may file `hash`: true for every hash inserted.
    pub(super) fn may_contain(&self, hash: &[u8; 16]) -> bool {
        self.segments.iter().any(|s| s.may_contain(hash))
    }

    /// The bytes the filter holds.
    pub(super) fn bytes(&self) -> usize {
        self.segments.iter().map(Segment::bytes).sum()
    }

    /// The bytes the next insert would add: a new segment's, or none.
    pub(super) fn next_growth(&self) -> usize {
        self.next_segment().map_or(0, |capacity| words(capacity) * 8)
    }

    /// The capacity of the segment the next insert opens (twice the last one's), or
    /// `None` while the last has room.
    fn next_segment(&self) -> Option<usize> {
        match self.segments.last() {
            Some(last) if last.len < last.capacity => None,
            last => Some(last.map_or(FIRST_KEYS, |s| s.capacity.saturating_mul(2))),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use sha2::{Digest, Sha256};

    use super::*;

    /// A dedup key as dispatch makes one: a SHA-256 prefix.
    fn hash(seed: u64, n: u64) -> [u8; 16] {
        let digest = Sha256::digest([seed.to_le_bytes(), n.to_le_bytes()].concat());
        let mut h = [0u8; 16];
        h.copy_from_slice(&digest[..16]);
        h
    }

    proptest! {
        /// No false negative, whatever the keys (chosen ones too, not only hashes) and
        /// however many segments they fill.
        #[test]
        fn every_key_inserted_is_found(
            keys in proptest::collection::vec(any::<[u8; 16]>(), 0..5_000),
        ) {
            let mut filter = Filter::default();
            let mut bytes = 0;
            for k in &keys {
                bytes += filter.insert(k);
            }
            prop_assert_eq!(bytes, filter.bytes());
            for k in &keys {
                prop_assert!(filter.may_contain(k));
            }
        }
    }

    /// About 1% of the hashes not inserted are taken for members, per segment: a
    /// filter of 100,000 keys (seven segments) answers "maybe" for at most 5% of
    /// others, and holds about 10 bits a key.
    #[test]
    fn false_positives_are_few_and_the_filter_is_small() {
        let mut filter = Filter::default();
        for n in 0..100_000 {
            let growth = filter.next_growth();
            assert_eq!(filter.insert(&hash(1, n)), growth, "what the next insert adds");
        }
        let misses = (0..100_000).filter(|&n| filter.may_contain(&hash(2, n))).count();
        assert!(misses < 5_000, "{misses} false positives in 100,000");
        assert!(filter.bytes() < 100_000 * 20 / 8, "{} bytes for 100,000 keys", filter.bytes());
        assert!(!Filter::default().may_contain(&hash(3, 0)), "an empty filter holds nothing");
    }
}
