//! The multisets of values that MIN/MAX over an input that retracts and DISTINCT calls keep
//! per group. They are stored in the `values` table, keyed by group, call and value, with the
//! value's count; and while the group is cached they are held in memory with it too
//! (`HeldValues`), so that counting a value and finding a group's extreme read no state.
//!
//! A group's values are held from its load: none when the group is new, or all of them read
//! in one scan of its range. A group with more than `VALUES_MAX` values is not held: its
//! values are read from state one at a time, and its extreme by a scan of its range.

use std::collections::BTreeMap;

use super::codec::{corrupt, decode_i64};
use crate::error::Result;
use crate::state::StateTable;

/// Most values of one group held in memory.
pub(super) const VALUES_MAX: usize = 4096;

/// What a value held takes besides its bytes: its place in the map and its vector.
const VALUE_BYTES: u64 = 64;

/// The key of one value in the `values` table: the group's key, the call, the value's bytes.
pub(super) fn value_key(group: &[u8], call: usize, value: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(group.len() + 1 + value.len());
    k.extend_from_slice(group);
    k.push(call as u8);
    k.extend_from_slice(value);
    k
}

/// All of a group's values, per call, as the `values` table has them.
#[derive(Debug)]
pub(super) struct HeldValues {
    calls: Vec<BTreeMap<Vec<u8>, i64>>,
    len: usize,
    bytes: u64,
}

impl HeldValues {
    /// The values of a group that has none.
    pub fn empty(calls: usize) -> HeldValues {
        HeldValues {
            calls: vec![BTreeMap::new(); calls],
            len: 0,
            bytes: 0,
        }
    }

    /// Reads the values of `group` from state, unless it has more than `max`.
    pub fn read(
        table: &StateTable,
        group: &[u8],
        calls: usize,
        max: usize,
    ) -> Result<Option<HeldValues>> {
        let mut held = HeldValues::empty(calls);
        let mut whole = true;
        table.try_scan(group, None, &mut |key, value| {
            if held.len == max {
                whole = false;
                return Ok(false);
            }
            let call = key.get(group.len()).copied().unwrap_or(u8::MAX) as usize;
            let count = decode_i64(value)?;
            match key.get(group.len() + 1..) {
                Some(bytes) if call < calls => held.set(call, bytes, count),
                _ => return Err(corrupt()),
            }
            Ok(true)
        })?;
        Ok(whole.then_some(held))
    }

    /// How many values are held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// What the values held are counted for.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The count of `value` in `call`'s multiset.
    pub fn count(&self, call: usize, value: &[u8]) -> i64 {
        self.calls[call].get(value).copied().unwrap_or(0)
    }

    /// Sets the count of `value` in `call`'s multiset (0: it is gone).
    pub fn set(&mut self, call: usize, value: &[u8], count: i64) {
        let values = &mut self.calls[call];
        let bytes = VALUE_BYTES + value.len() as u64;
        if count == 0 {
            if values.remove(value).is_some() {
                self.len -= 1;
                self.bytes -= bytes;
            }
        } else if let Some(c) = values.get_mut(value) {
            *c = count;
        } else {
            values.insert(value.to_vec(), count);
            self.len += 1;
            self.bytes += bytes;
        }
    }

    /// The least value of `call`'s multiset, or the greatest.
    pub fn extreme(&self, call: usize, greatest: bool) -> Option<&[u8]> {
        let values = &self.calls[call];
        let entry = if greatest {
            values.last_key_value()
        } else {
            values.first_key_value()
        };
        entry.map(|(k, _)| k.as_slice())
    }
}

/// Changes the count of one value of a call by `w`, in state and in the group's values when
/// they are held; returns the count before and after.
pub(super) fn count_value(
    table: &mut StateTable,
    held: Option<&mut HeldValues>,
    group: &[u8],
    call: usize,
    value: &[u8],
    w: i64,
) -> Result<(i64, i64)> {
    let key = value_key(group, call, value);
    let before = match &held {
        Some(held) => held.count(call, value),
        None => match table.get(&key)? {
            Some(v) => decode_i64(&v)?,
            None => 0,
        },
    };
    let after = before + w;
    assert!(
        after >= 0,
        "aggregate value retracted more often than added"
    );
    if after == 0 {
        table.delete(key);
    } else {
        table.put(key, after.to_le_bytes().to_vec());
    }
    if let Some(held) = held {
        held.set(call, value, after);
    }
    Ok((before, after))
}
