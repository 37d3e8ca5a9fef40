//! The ledger's rows in `outcomes`: a row is the counters one key shares (an event
//! name's appends, its dispatch verdicts, a destination's states), its key the hour,
//! the row's kind and its names, its value the counters as big-endian i64s.

use std::collections::BTreeMap;

use crate::store::lifecycle::ledger::{Count, LedgerEdits, LedgerKey};
use crate::store::{hex, DeliveryState, StoreError};

use super::OUTCOMES;

/// First byte of a ledger key in `outcomes` (event outcomes start with 0x00 or 0x01,
/// the cursor with `d`).
pub(super) const LEDGER: u8 = 2;

pub(super) fn part(out: &mut Vec<u8>, text: &str) {
    let len = u16::try_from(text.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&text.as_bytes()[..usize::from(len)]);
}

/// The counters of one row, in the order of its value's slots. A row is one sled key,
/// so a change writes one key per source-and-event or destination it touches, not one
/// per count. Appends have a row of their own: they are written outside the rules'
/// transactions (under `last_id`), and two writers must never share a key.
const APPEND_ROW: &[Count] = &[Count::Received, Count::Rejected];
const EVENT_ROW: &[Count] = &[Count::Unrouted, Count::Duplicate, Count::Routed, Count::Triggered];
const DESTINATION_ROW: &[Count] = &[
    Count::Routed,
    Count::State(DeliveryState::Delivered),
    Count::State(DeliveryState::Filtered),
    Count::State(DeliveryState::Superseded),
    Count::State(DeliveryState::Dead),
    Count::State(DeliveryState::Discarded),
    Count::State(DeliveryState::Pending),
    Count::State(DeliveryState::Retrying),
    Count::State(DeliveryState::Held),
];

/// The rows, by the byte after the hour in their key.
pub(super) const ROWS: [&[Count]; 3] = [APPEND_ROW, EVENT_ROW, DESTINATION_ROW];

/// The row of a counter (its key) and its slot in the row's value.
pub(super) fn row_of(key: &LedgerKey) -> Option<(Vec<u8>, usize)> {
    let kind: u8 = match key.count {
        _ if !key.destination.is_empty() => 2,
        Count::Received | Count::Rejected => 0,
        _ => 1,
    };
    let slot = ROWS[usize::from(kind)].iter().position(|c| *c == key.count)?;
    let mut out =
        Vec::with_capacity(16 + key.source.len() + key.event.len() + key.destination.len());
    out.push(LEDGER);
    out.extend_from_slice(&key.hour.to_be_bytes());
    out.push(kind);
    for text in [&key.source, &key.event, &key.destination] {
        part(&mut out, text);
    }
    Some((out, slot))
}

/// A row's key read back: its hour, kind, source, event and destination.
pub(super) fn decode_row(bytes: &[u8]) -> Option<(u64, u8, [String; 3])> {
    let (&first, rest) = bytes.split_first()?;
    if first != LEDGER || rest.len() < 9 {
        return None;
    }
    let hour = u64::from_be_bytes(rest[..8].try_into().ok()?);
    let kind = rest[8];
    if usize::from(kind) >= ROWS.len() {
        return None;
    }
    let mut rest = &rest[9..];
    let mut texts: [String; 3] = Default::default();
    for text in &mut texts {
        let len = usize::from(u16::from_be_bytes(rest.get(..2)?.try_into().ok()?));
        *text = std::str::from_utf8(rest.get(2..2 + len)?).ok()?.to_owned();
        rest = &rest[2 + len..];
    }
    Some((hour, kind, texts))
}

/// A row's value: one big-endian i64 per slot (a shorter value reads as zeros beyond).
pub(super) fn decode_values(
    key: &[u8],
    value: &[u8],
    width: usize,
) -> Result<Vec<i64>, StoreError> {
    if !value.len().is_multiple_of(8) || value.len() / 8 > width {
        return Err(StoreError::Corrupt {
            table: OUTCOMES,
            key: hex(key),
            reason: "a ledger row is not a whole number of counters".into(),
        });
    }
    let mut out: Vec<i64> =
        value.chunks_exact(8).map(|c| i64::from_be_bytes(c.try_into().unwrap_or([0; 8]))).collect();
    out.resize(width, 0);
    Ok(out)
}

pub(super) fn encode_values(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_be_bytes()).collect()
}

/// A row's new value: `old` (absent: zeros) with `deltas` added.
pub(super) fn added(
    row: &[u8],
    old: Option<&[u8]>,
    width: usize,
    deltas: &Deltas,
) -> Result<Vec<u8>, StoreError> {
    let mut values = match old {
        Some(v) => decode_values(row, v, width)?,
        None => vec![0; width],
    };
    for (slot, n) in deltas {
        values[*slot] += n;
    }
    Ok(encode_values(&values))
}

/// What to add to which slot of a row.
type Deltas = Vec<(usize, i64)>;
/// A row's edit: its key, its width, and its deltas.
type RowEdit = (Vec<u8>, usize, Deltas);
/// A row's key and its new value.
pub(super) type RowWrite = (Vec<u8>, Vec<u8>);

/// `edits` grouped by row.
pub(super) fn by_row(edits: &LedgerEdits) -> Result<Vec<RowEdit>, StoreError> {
    let mut rows: BTreeMap<Vec<u8>, (usize, Deltas)> = BTreeMap::new();
    for (key, n) in edits {
        let Some((row, slot)) = row_of(key) else {
            return Err(StoreError::Corrupt {
                table: OUTCOMES,
                key: key.count.as_str().to_owned(),
                reason: "a count the ledger does not keep".into(),
            });
        };
        let width = ROWS[usize::from(row[9])].len();
        rows.entry(row).or_insert_with(|| (width, Vec::new())).1.push((slot, *n));
    }
    Ok(rows.into_iter().map(|(k, (w, d))| (k, w, d)).collect())
}
