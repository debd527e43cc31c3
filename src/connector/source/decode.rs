//! Payloads into rows: each message of a message-based source (a Kafka topic's values) is one
//! row of the source's columns, encoded as JSON or CSV. A batch of payloads is decoded at once
//! by Arrow's decoders, which is what keeps a busy topic cheap; a batch in which a payload is
//! not exactly one row is decoded again payload by payload, to tell the bad ones (skipped, or
//! failing the source) from the rows.

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;

use crate::error::{Error, ErrorKind, Result};

/// How a payload is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encode {
    Json,
    Csv,
    /// Parquet files (a files source's; not a message's encoding).
    Parquet,
}

impl Encode {
    /// Reads `ENCODE <name>` (lower-case).
    pub fn named(name: &str) -> Option<Encode> {
        match name {
            "json" => Some(Encode::Json),
            "csv" => Some(Encode::Csv),
            "parquet" => Some(Encode::Parquet),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Encode::Json => "json",
            Encode::Csv => "csv",
            Encode::Parquet => "parquet",
        }
    }
}

/// Decodes payloads into rows of `schema`.
#[derive(Debug, Clone)]
pub struct Payloads {
    pub encode: Encode,
    pub schema: SchemaRef,
}

/// What a batch of payloads decoded into.
#[derive(Debug, Default)]
pub struct Decoded {
    /// One row per payload that decoded, in order; `None` when none did.
    pub batch: Option<RecordBatch>,
    /// The index of each row's payload.
    pub rows: Vec<usize>,
    /// The payloads that did not decode into exactly one row, and why.
    pub bad: Vec<(usize, String)>,
}

impl Payloads {
    pub fn decode(&self, payloads: &[&[u8]]) -> Result<Decoded> {
        if payloads.is_empty() {
            return Ok(Decoded::default());
        }
        let whole = match self.encode {
            Encode::Json => self.json_whole(payloads),
            Encode::Csv => self.csv_whole(payloads),
            Encode::Parquet => None,
        };
        if let Some(batch) = whole {
            return Ok(Decoded {
                batch: Some(batch),
                rows: (0..payloads.len()).collect(),
                bad: Vec::new(),
            });
        }
        // One at a time, to find the bad ones.
        let mut good = Vec::new();
        let mut decoded = Decoded::default();
        for (i, p) in payloads.iter().enumerate() {
            match self.one(p) {
                Ok(batch) => {
                    good.push(batch);
                    decoded.rows.push(i);
                }
                Err(why) => decoded.bad.push((i, why)),
            }
        }
        if !good.is_empty() {
            decoded.batch = Some(datafusion::arrow::compute::concat_batches(
                &self.schema,
                &good,
            )?);
        }
        Ok(decoded)
    }

    /// Every payload as one JSON document into one decoder, each checked to add exactly one
    /// row; `None` when one does not (or one fails), to be told apart one by one.
    fn json_whole(&self, payloads: &[&[u8]]) -> Option<RecordBatch> {
        let mut decoder = datafusion::arrow::json::ReaderBuilder::new(self.schema.clone())
            .with_batch_size(payloads.len() + 1)
            .build_decoder()
            .ok()?;
        for (i, p) in payloads.iter().enumerate() {
            if decoder.decode(p).ok()? != p.len()
                || decoder.has_partial_record()
                || decoder.len() != i + 1
            {
                return None;
            }
        }
        decoder.flush().ok()?
    }

    /// Every payload as one line of one CSV text: one row each when no payload holds a line
    /// break and the rows counted are as many as the payloads.
    fn csv_whole(&self, payloads: &[&[u8]]) -> Option<RecordBatch> {
        if payloads
            .iter()
            .any(|p| p.contains(&b'\n') || p.contains(&b'\r'))
        {
            return None;
        }
        let mut joined = Vec::with_capacity(payloads.iter().map(|p| p.len() + 1).sum());
        for p in payloads {
            joined.extend_from_slice(p);
            joined.push(b'\n');
        }
        let mut decoder = datafusion::arrow::csv::ReaderBuilder::new(self.schema.clone())
            .with_batch_size(payloads.len() + 1)
            .build_decoder();
        let mut rest = &joined[..];
        while !rest.is_empty() {
            let read = decoder.decode(rest).ok()?;
            if read == 0 {
                break;
            }
            rest = &rest[read..];
        }
        decoder.decode(&[]).ok()?;
        let batch = decoder.flush().ok()??;
        (batch.num_rows() == payloads.len()).then_some(batch)
    }

    /// One payload as one row, or why not.
    fn one(&self, payload: &[u8]) -> std::result::Result<RecordBatch, String> {
        let batch = match self.encode {
            Encode::Parquet => return Err("a message is not a Parquet file".into()),
            Encode::Json => {
                let mut decoder = datafusion::arrow::json::ReaderBuilder::new(self.schema.clone())
                    .with_batch_size(2)
                    .build_decoder()
                    .map_err(|e| e.to_string())?;
                let read = decoder.decode(payload).map_err(|e| e.to_string())?;
                if read != payload.len() || decoder.has_partial_record() {
                    return Err("not one JSON object".into());
                }
                decoder.flush().map_err(|e| e.to_string())?
            }
            Encode::Csv => {
                let mut decoder = datafusion::arrow::csv::ReaderBuilder::new(self.schema.clone())
                    .with_batch_size(2)
                    .build_decoder();
                let mut line = payload.to_vec();
                line.push(b'\n');
                let mut rest = &line[..];
                while !rest.is_empty() {
                    let read = decoder.decode(rest).map_err(|e| e.to_string())?;
                    if read == 0 {
                        break;
                    }
                    rest = &rest[read..];
                }
                decoder.decode(&[]).map_err(|e| e.to_string())?;
                decoder.flush().map_err(|e| e.to_string())?
            }
        };
        match batch {
            Some(b) if b.num_rows() == 1 => Ok(b),
            Some(b) => Err(format!("{} rows, not one", b.num_rows())),
            None => Err("no row".into()),
        }
    }
}

/// A payload that did not decode, for a source whose `on_error` is `fail` (22P02, as
/// PostgreSQL's invalid input).
pub fn malformed(source: &str, at: &str, why: &str) -> Error {
    Error::new(
        ErrorKind::InvalidText,
        format!("source \"{source}\" read a message that is not a row ({at}): {why}"),
    )
    .with_hint("With on_error = 'skip' a source skips such messages and records them in weir_catalog.source_errors.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    fn payloads(encode: Encode) -> Payloads {
        Payloads {
            encode,
            schema: Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, true),
                Field::new("name", DataType::Utf8, true),
            ])),
        }
    }

    fn ids(d: &Decoded) -> Vec<i64> {
        let Some(b) = &d.batch else { return vec![] };
        let ids = b
            .column(0)
            .as_any()
            .downcast_ref::<datafusion::arrow::array::Int64Array>()
            .unwrap();
        ids.values().to_vec()
    }

    #[test]
    fn a_batch_of_good_json_payloads_is_one_row_each() {
        let p = payloads(Encode::Json);
        let d = p
            .decode(&[br#"{"id": 1, "name": "a"}"#, br#"{"id": 2, "extra": true}"#])
            .unwrap();
        assert_eq!(ids(&d), [1, 2]);
        assert_eq!(d.rows, [0, 1]);
        assert!(d.bad.is_empty());
    }

    #[test]
    fn payloads_that_are_not_one_row_are_told_apart() {
        let p = payloads(Encode::Json);
        // Two objects in one payload, an object split over two, a wrong type, nothing.
        let batch: [&[u8]; 7] = [
            br#"{"id": 1}"#,
            br#"{"id": 2}{"id": 3}"#,
            br#"{"id": 4"#,
            br#"}"#,
            br#"{"id": "five"}"#,
            b"",
            br#"{"id": 6}"#,
        ];
        let d = p.decode(&batch).unwrap();
        assert_eq!(ids(&d), [1, 6]);
        assert_eq!(d.rows, [0, 6]);
        assert_eq!(
            d.bad.iter().map(|b| b.0).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
    }

    #[test]
    fn csv_payloads_are_lines_and_a_line_break_inside_one_is_read_alone() {
        let p = payloads(Encode::Csv);
        let d = p.decode(&[b"1,a", b"2,\"b\nc\"", b"x,y", b"3,d"]).unwrap();
        assert_eq!(ids(&d), [1, 2, 3]);
        assert_eq!(d.rows, [0, 1, 3]);
        assert_eq!(d.bad.len(), 1);
        // A payload with an open quote cannot swallow the next one (alone, Arrow's decoder
        // closes the quote at its end).
        let d = p.decode(&[b"1,\"a", b"2,b"]).unwrap();
        assert_eq!(ids(&d), [1, 2]);
    }
}
