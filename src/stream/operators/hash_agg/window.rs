//! EMIT ON WINDOW CLOSE: a group emits nothing while its window is open; when the watermark
//! passes the window, its one final row is emitted and its state deleted.

use std::collections::BTreeSet;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::TimestampMicrosecondType;
use datafusion::common::ScalarValue;
use datafusion::physical_expr::expressions::Column;

use super::groups::Place;
use super::{HashAgg, VNODE_BYTES};
use crate::error::{Error, Result};
use crate::stream::chunk::StreamChunk;
use crate::stream::message::Watermark;
use crate::stream::operator::Emit;

impl HashAgg {
    /// Which rows belong to windows already closed: they are late and change nothing.
    pub(super) fn late(&self, group_columns: &[ArrayRef], rows: usize) -> Result<Vec<bool>> {
        let (Some((w, _)), Some(closed)) = (&self.close_on, self.closed_below) else {
            return Ok(vec![false; rows]);
        };
        let window = group_columns[*w]
            .as_primitive_opt::<TimestampMicrosecondType>()
            .ok_or_else(|| Error::internal("window column is not a timestamp"))?;
        Ok((0..rows)
            .map(|i| window.is_null(i) || window.value(i) < closed)
            .collect())
    }

    /// Saves the state of the open windows the epoch touched; they emit nothing yet.
    pub(super) fn save_open_windows(&mut self) {
        for place in self.take_dirty() {
            let key = self.cache.key(place).to_vec();
            let state = &self.cache.get(place).expect("cached").state;
            if state.rows == 0 {
                self.groups.delete(key);
                self.uncache(place);
            } else {
                let bytes = super::encode_state(state);
                self.groups.put(key, bytes);
            }
        }
    }

    /// Closes the windows below a watermark of the window column: emits their final rows,
    /// deletes their state, and passes the watermark on (the window column keeps its
    /// position in the output).
    pub(super) fn close_windows(
        &mut self,
        watermark: Watermark,
        out: &mut dyn Emit,
    ) -> Result<Vec<Watermark>> {
        let Some((window, codec)) = &self.close_on else {
            return Ok(Vec::new());
        };
        let window = *window;
        let is_window = self.group_exprs[window]
            .downcast_ref::<Column>()
            .is_some_and(|c| c.index() == watermark.column);
        if !is_window || self.closed_below.is_some_and(|c| c >= watermark.value) {
            return Ok(Vec::new());
        }
        self.closed_below = Some(watermark.value);
        // Within each virtual node, keys below this are the windows that closed. State holds
        // open windows only, so reading all of it stays cheap; a complete cache holds them all.
        let bound = codec
            .encode(&[ScalarValue::TimestampMicrosecond(Some(watermark.value), None).to_array()?])?
            .remove(0);
        let closed = |k: &[u8]| k.get(VNODE_BYTES..).is_some_and(|k| k < bound.as_slice());
        let mut closing: BTreeSet<Vec<u8>> = BTreeSet::new();
        if !self.holds_all {
            self.groups.scan(&[], false, &mut |k, _| {
                if closed(k) {
                    closing.insert(k.to_vec());
                }
                true
            })?;
        }
        closing.extend(
            self.cache
                .iter()
                .map(|(k, _)| k)
                .filter(|k| closed(k))
                .map(<[u8]>::to_vec),
        );
        let mut places = Vec::with_capacity(closing.len());
        for key in &closing {
            places.push(self.load(key)?);
        }
        let live: Vec<Place> = places
            .iter()
            .copied()
            .filter(|&p| self.cache.get(p).is_some_and(|c| c.state.rows > 0))
            .collect();
        if let Some(rows) = self.output_rows(&live)? {
            // A closed window's row is final: an error in it stays counted.
            for e in rows.failures.iter().flatten() {
                self.errors.record(e, 1);
            }
            out.emit(StreamChunk::inserts(rows.batch))?;
        }
        for (key, place) in closing.into_iter().zip(places) {
            self.forget(key, place)?;
        }
        Ok(vec![Watermark {
            column: window,
            value: watermark.value,
        }])
    }

    /// Deletes a closed group's state and its calls' values.
    fn forget(&mut self, key: Vec<u8>, place: Place) -> Result<()> {
        self.uncache(place);
        let mut values = Vec::new();
        self.values.scan(&key, false, &mut |k, _| {
            values.push(k.to_vec());
            true
        })?;
        for v in values {
            self.values.delete(v);
        }
        self.groups.delete(key);
        Ok(())
    }
}
