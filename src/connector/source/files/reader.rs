//! A files source's reader: its files in name order, one after the other, each decoded by
//! Arrow's CSV or JSON decoder a chunk of bytes at a time. Its position is the file and the
//! byte where the last row it returned ends: a decoder stops at full batches, which end at a
//! row's end, so a restart reads on from that byte (the header only at a file's first byte).
//! A reader started at a row count alone (a checkpoint written before positions were kept)
//! skips that many rows. With a refresh interval the source's own reader, at the end of its
//! files, lists them again for new ones.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use serde::{Deserialize, Serialize};

use super::ledger::FileLedger;
use super::store::{Input, Listed, Store, Whole};
use crate::connector::source::decode::Encode;
use crate::connector::source::Start;
use crate::error::{Error, ErrorKind, Result};
use crate::stream::{Batches, Splits, FEED_ROWS_MAX};

/// The one split of a files source: its files are read in order, one after the other.
const SPLIT: &str = "files";

/// Where a files source resumes: in file `file` (its name), at byte `byte`, the end of the
/// last row it returned; in a Parquet file, at its row `row`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Position {
    file: String,
    #[serde(default)]
    byte: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    row: Option<u64>,
}

/// A decoder of one encoding's rows.
enum Decoder {
    Csv(Box<datafusion::arrow::csv::reader::Decoder>),
    Json(datafusion::arrow::json::reader::Decoder),
}

impl Decoder {
    fn new(encode: Encode, schema: SchemaRef, header: bool, rows: usize) -> Result<Decoder> {
        Ok(match encode {
            Encode::Csv => Decoder::Csv(Box::new(
                datafusion::arrow::csv::ReaderBuilder::new(schema)
                    .with_header(header)
                    .with_batch_size(rows)
                    .build_decoder(),
            )),
            // Never used: a Parquet file is read by its own reader (`Body::Parquet`).
            Encode::Json | Encode::Parquet => Decoder::Json(
                datafusion::arrow::json::ReaderBuilder::new(schema)
                    .with_batch_size(rows)
                    .build_decoder()?,
            ),
        })
    }

    fn decode(&mut self, bytes: &[u8]) -> Result<usize> {
        Ok(match self {
            Decoder::Csv(d) => d.decode(bytes)?,
            Decoder::Json(d) => d.decode(bytes)?,
        })
    }

    /// A batch's rows are all decoded: what follows belongs to the next batch.
    fn full(&self, rows: usize) -> bool {
        match self {
            Decoder::Csv(d) => d.capacity() == 0,
            Decoder::Json(d) => d.len() >= rows,
        }
    }

    fn flush(&mut self) -> Result<Option<RecordBatch>> {
        Ok(match self {
            Decoder::Csv(d) => d.flush()?,
            Decoder::Json(d) => d.flush()?,
        })
    }
}

/// A file being read: its index among the source's files, and how it is read.
struct Current {
    index: usize,
    body: Body,
}

enum Body {
    /// CSV or JSON: its bytes, the decoder of its rows, the bytes read but not decoded yet,
    /// and the bytes decoded so far.
    Text {
        input: Input,
        decoder: Decoder,
        pending: Bytes,
        byte: u64,
    },
    /// Parquet: its rows, and how many were read so far.
    Parquet {
        rows: Box<ParquetRecordBatchReader>,
        row: u64,
    },
}

/// How a reader reads its files.
pub struct Format {
    pub encode: Encode,
    pub header: bool,
    pub schema: SchemaRef,
    /// The file names it reads end so.
    pub extensions: &'static [&'static str],
}

pub struct FilesReader {
    store: Store,
    format: Format,
    files: Vec<Listed>,
    ledger: Option<FileLedger>,
    current: Option<Current>,
    next_file: usize,
    /// Rows still to skip before the first one returned (a start by row count).
    skip: u64,
    /// Rows read so far, skipped ones included.
    rows: u64,
    /// The file and byte where the last row returned ends.
    at: Option<(usize, u64)>,
    /// Rows per batch at most.
    batch_rows: usize,
    /// The source's own reader's wait between listings once its files are read; `None`: it
    /// ends with them.
    refresh: Option<Duration>,
}

impl FilesReader {
    /// A reader of `store`'s files from `start`. With a ledger, the files before its row
    /// (the start, or the rows to be read again) must be those it recorded.
    pub async fn open(
        store: Store,
        format: Format,
        start: Start<'_>,
        mut ledger: Option<(FileLedger, u64)>,
        refresh: Option<Duration>,
    ) -> Result<FilesReader> {
        let files = store.list(format.extensions).await?;
        if let Some((l, checked)) = &mut ledger {
            l.check(&files, *checked)?;
        }
        let mut reader = FilesReader {
            store,
            format,
            files,
            ledger: ledger.map(|(l, _)| l),
            current: None,
            next_file: 0,
            skip: start.rows,
            rows: 0,
            at: None,
            batch_rows: FEED_ROWS_MAX,
            refresh,
        };
        if let Some(position) = start.splits.and_then(|s| s.get(SPLIT)) {
            let position: Position = serde_json::from_value(position.clone()).map_err(|e| {
                Error::new(
                    ErrorKind::DataCorruption,
                    format!("a file source's position does not read: {e}"),
                )
            })?;
            reader.resume(&position, start.rows).await?;
        }
        Ok(reader)
    }

    /// Goes to `position`, after the source's first `rows` rows.
    async fn resume(&mut self, position: &Position, rows: u64) -> Result<()> {
        let index = (self.files.iter())
            .position(|f| f.name == position.file)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::ObjectNotInPrerequisiteState,
                    format!(
                        "file \"{}\", where the source had read to, is gone",
                        position.file
                    ),
                )
            })?;
        // A text file read to its end is not opened again (an object store refuses a range
        // that starts at its end).
        let at = position.row.unwrap_or(position.byte);
        self.current = if position.row.is_some() || position.byte < self.files[index].size {
            Some(self.start_file(index, at).await?)
        } else {
            None
        };
        self.next_file = index + 1;
        (self.skip, self.rows) = (0, rows);
        self.at = Some((index, at));
        Ok(())
    }

    /// File number `index`, read from its byte `byte` on (only the start has a header), or a
    /// Parquet file from its row `byte`.
    fn start_file(
        &self,
        index: usize,
        byte: u64,
    ) -> impl std::future::Future<Output = Result<Current>> + Send + 'static {
        let store = self.store.clone();
        let file = self.files[index].clone();
        let f = &self.format;
        let encode = f.encode;
        let rows = self.batch_rows;
        let decoder = Decoder::new(f.encode, f.schema.clone(), f.header && byte == 0, rows);
        async move {
            if encode == Encode::Parquet {
                let whole = store.open_whole(&file.name, file.size).await?;
                let rows = crate::blocking(|| parquet_rows(whole, byte, rows)).map_err(|e| {
                    Error::new(
                        ErrorKind::InvalidText,
                        format!("{}: {e}", store.locate(&file.name)),
                    )
                })?;
                return Ok(Current {
                    index,
                    body: Body::Parquet {
                        rows: Box::new(rows),
                        row: byte,
                    },
                });
            }
            let input = store.open(&file.name, byte).await?;
            Ok(Current {
                index,
                body: Body::Text {
                    input,
                    decoder: decoder?,
                    pending: Bytes::new(),
                    byte,
                },
            })
        }
    }

    /// The next file to read: the next one listed, or, with a refresh interval, one listed
    /// again after waiting; `None` at the end.
    async fn next_file(&mut self) -> Result<Option<Current>> {
        while self.next_file >= self.files.len() {
            let Some(wait) = self.refresh else {
                return Ok(None);
            };
            tokio::time::sleep(wait).await;
            let listed = self.store.list(self.format.extensions).await?;
            // The files read must still lead the listing: new ones sort after them.
            if let Some(l) = &mut self.ledger {
                l.check(&listed, u64::MAX)?;
            }
            self.files = listed;
        }
        let index = self.next_file;
        if let Some(l) = &mut self.ledger {
            l.reached(index, &self.files[index], self.rows)?;
        }
        let current = self.start_file(index, 0).await?;
        self.next_file += 1;
        Ok(Some(current))
    }

    /// The next batch of the files, skipped rows included.
    async fn read(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            if self.current.is_none() {
                match self.next_file().await? {
                    Some(c) => self.current = Some(c),
                    None => return Ok(None),
                }
            }
            let Some(current) = &mut self.current else {
                continue;
            };
            let (store, name) = (&self.store, &self.files[current.index].name);
            let bad = |e: &dyn std::fmt::Display| {
                Error::new(
                    ErrorKind::InvalidText,
                    format!("{}: {e}", store.locate(name)),
                )
            };
            let batch = match &mut current.body {
                Body::Text {
                    input,
                    decoder,
                    pending,
                    byte,
                } => {
                    // Decodes until a batch is full (the bytes decoded then end at a row's
                    // end) or the file ends.
                    loop {
                        if pending.is_empty() {
                            match input.next().await? {
                                Some(bytes) => *pending = bytes,
                                None => break decoder.flush().map_err(|e| bad(&e))?,
                            }
                        }
                        let decoded = decoder.decode(pending).map_err(|e| bad(&e))?;
                        *pending = pending.slice(decoded..);
                        *byte += decoded as u64;
                        if decoder.full(self.batch_rows) {
                            break decoder.flush().map_err(|e| bad(&e))?;
                        }
                    }
                    .map(|b| (b, *byte))
                }
                Body::Parquet { rows, row } => {
                    match crate::blocking(|| rows.next())
                        .transpose()
                        .map_err(|e| bad(&e))?
                    {
                        Some(b) => {
                            *row += b.num_rows() as u64;
                            Some((conform(&b, &self.format.schema).map_err(|e| bad(&e))?, *row))
                        }
                        None => None,
                    }
                }
            };
            match batch {
                Some((batch, at)) => {
                    self.at = Some((current.index, at));
                    return Ok(Some(batch));
                }
                None => self.current = None,
            }
        }
    }
}

/// A Parquet file's rows from row `from` on, `batch` at a time. Blocking.
fn parquet_rows(
    whole: Whole,
    from: u64,
    batch: usize,
) -> std::result::Result<ParquetRecordBatchReader, parquet::errors::ParquetError> {
    match whole {
        Whole::Local(file) => ParquetRecordBatchReaderBuilder::try_new(file)?
            .with_batch_size(batch)
            .with_offset(from as usize)
            .build(),
        Whole::Remote(bytes) => ParquetRecordBatchReaderBuilder::try_new(bytes)?
            .with_batch_size(batch)
            .with_offset(from as usize)
            .build(),
    }
}

/// A Parquet file's rows as the source's columns: each by name, cast to the declared type
/// (a value that does not fit fails), NULL where the file has no such column.
fn conform(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let options = datafusion::arrow::compute::CastOptions {
        safe: false,
        ..Default::default()
    };
    let columns = schema
        .fields()
        .iter()
        .map(|f| match batch.column_by_name(f.name()) {
            Some(c) => Ok(datafusion::arrow::compute::cast_with_options(
                c,
                f.data_type(),
                &options,
            )?),
            None => Ok(datafusion::arrow::array::new_null_array(
                f.data_type(),
                batch.num_rows(),
            )),
        })
        .collect::<Result<Vec<_>>>()?;
    let options =
        datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &options,
    )?)
}

#[async_trait::async_trait]
impl Batches for FilesReader {
    /// The next rows after those skipped.
    async fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        // Where a test holds the reader (`:pause`), to checkpoint it in the middle of a file.
        crate::failpoint::reach("source.files.batch").await;
        loop {
            let Some(batch) = self.read().await? else {
                return Ok(None);
            };
            let n = batch.num_rows() as u64;
            self.rows += n;
            if self.skip >= n {
                self.skip -= n;
                continue;
            }
            let from = self.skip as usize;
            self.skip = 0;
            return Ok(Some(batch.slice(from, batch.num_rows() - from)));
        }
    }
}

impl crate::connector::source::Reader for FilesReader {
    fn splits(&self) -> Option<Splits> {
        let (index, at) = self.at?;
        let parquet = self.format.encode == Encode::Parquet;
        let position = Position {
            file: self.files[index].name.clone(),
            byte: if parquet { 0 } else { at },
            row: parquet.then_some(at),
        };
        let value = serde_json::to_value(position).ok()?;
        Some(Arc::new(BTreeMap::from([(SPLIT.to_string(), value)])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connector::source::Reader;
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use std::path::Path;

    fn keys(batch: &RecordBatch) -> Vec<i64> {
        batch
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec()
    }

    fn format(encode: Encode, header: bool) -> Format {
        Format {
            encode,
            header,
            schema: Arc::new(Schema::new(vec![
                Field::new("k", DataType::Int64, true),
                Field::new("s", DataType::Utf8, true),
            ])),
            extensions: super::super::extensions(encode),
        }
    }

    /// A Parquet file of `rows` whose `k` is an int32 (the source declares a bigint: read by
    /// name and cast), after an extra column.
    fn parquet(path: &Path, rows: &[(i64, &str)]) {
        use datafusion::arrow::array::{Int32Array, StringArray};
        let schema = Arc::new(Schema::new(vec![
            Field::new("extra", DataType::Utf8, true),
            Field::new("k", DataType::Int32, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(rows.iter().map(|_| Some("x")).collect::<StringArray>()),
                Arc::new(
                    rows.iter()
                        .map(|r| Some(r.0 as i32))
                        .collect::<Int32Array>(),
                ),
                Arc::new(rows.iter().map(|r| Some(r.1)).collect::<StringArray>()),
            ],
        )
        .unwrap();
        let file = std::fs::File::create(path).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(file, schema, None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }

    /// Every key from `start` on, and after each batch the rows so far and the position.
    async fn read_from(
        dir: &Path,
        f: Format,
        start: Start<'_>,
    ) -> (Vec<i64>, Vec<(u64, Option<Splits>)>) {
        let store = Store::local(&dir.display().to_string());
        let mut r = FilesReader::open(store, f, start, None, None)
            .await
            .unwrap();
        r.batch_rows = 2;
        let (mut all, mut positions) = (Vec::new(), Vec::new());
        let mut rows = start.rows;
        while let Some(b) = r.next_batch().await.unwrap() {
            all.extend(keys(&b));
            rows += b.num_rows() as u64;
            positions.push((rows, r.splits()));
        }
        (all, positions)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_files_in_name_order_from_any_offset_or_position() {
        for (encode, header, newline) in [
            (Encode::Csv, false, "\n"),
            (Encode::Csv, true, "\r\n"),
            (Encode::Json, false, "\n"),
            (Encode::Parquet, false, ""),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let file = |name: &str, rows: &[(i64, &str)]| {
                if encode == Encode::Parquet {
                    return parquet(&dir.path().join(format!("{name}.parquet")), rows);
                }
                let mut text = if header {
                    format!("k,s{newline}")
                } else {
                    String::new()
                };
                for (k, s) in rows {
                    match encode {
                        Encode::Csv => text.push_str(&format!("{k},{s}")),
                        _ => text.push_str(&format!(r#"{{"k": {k}, "s": "{s}"}}"#)),
                    }
                    text.push_str(newline);
                }
                let ext = if encode == Encode::Csv { "csv" } else { "json" };
                std::fs::write(dir.path().join(format!("{name}.{ext}")), text).unwrap();
            };
            file("part-1", &[(3, "c"), (4, "d"), (5, "e")]);
            file("part-0", &[(1, "a"), (2, "b")]);
            std::fs::write(dir.path().join("notes.txt"), "not read").unwrap();
            let (all, positions) =
                read_from(dir.path(), format(encode, header), Start::FIRST).await;
            assert_eq!(all, vec![1, 2, 3, 4, 5]);
            // Two full batches, then the end of part-1 with one row.
            assert_eq!(positions.len(), 3, "{positions:?}");
            for (rows, splits) in &positions {
                let start = Start {
                    rows: *rows,
                    splits: splits.as_deref(),
                };
                let (rest, _) = read_from(dir.path(), format(encode, header), start).await;
                assert_eq!(rest, all[*rows as usize..], "from {splits:?}");
                let by_count = Start {
                    rows: *rows,
                    splits: None,
                };
                let (counted, _) = read_from(dir.path(), format(encode, header), by_count).await;
                assert_eq!(counted, rest);
            }
        }
        let missing = Store::local("/nonexistent/weir");
        assert!(missing.list(&[".csv"]).await.is_err());
    }
}
