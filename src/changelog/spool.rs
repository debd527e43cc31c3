//! A statement's rows as they are computed or received, before they are checked and logged:
//! in memory while they are few, in a file of the data directory's spool once they pass a
//! part's size (`PartSize`, `docs/design/0023-large-writes.md`). A spooled statement becomes a group
//! of records in its table's log, so that only the disk budget of statements' temporary files
//! (`TempDisk`) bounds how much one statement writes.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;

use super::temp::{Charged, TempDisk, TempFile};
use crate::error::{Error, Result};

/// Arrow memory a statement's rows may take before they go to the spool: about a part (a
/// record of a group), so that what is held in memory is the same either way.
pub const MEMORY_BYTES: usize = 32 << 20;

/// Rows a statement may have before they go to the spool, and rows of a part: what a table's
/// actor, its views and its writer hold per row in an epoch (encoded rows and keys, pending
/// state writes) is several times a narrow row's Arrow bytes.
pub const PART_ROWS: usize = 128 << 10;

/// The fewest rows of a part, however small the statement's share: each part is an epoch.
const PART_ROWS_MIN: usize = 1 << 10;

/// How much of a statement's rows is held at once: gathered in memory before the rest goes to
/// the spool, and a part of a spooled statement, which its table's writer checks and applies,
/// and its views take, in an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartSize {
    bytes: usize,
    rows: usize,
}

impl PartSize {
    /// The parts of a statement without a share of its own: `MEMORY_BYTES` and `PART_ROWS`.
    pub const WHOLE: PartSize = PartSize {
        bytes: MEMORY_BYTES,
        rows: PART_ROWS,
    };

    /// The parts of a statement whose working memory is bounded by `share` bytes (its
    /// session's `statement_mem`): below `MEMORY_BYTES`, parts of `share` bytes and as many
    /// fewer rows (at least `PART_ROWS_MIN`), so that a statement with a small share spools
    /// its rows sooner and its table's writer holds less of them.
    pub fn within(share: Option<usize>) -> PartSize {
        match share {
            Some(share) if share < MEMORY_BYTES => PartSize {
                bytes: share,
                rows: (PART_ROWS / (MEMORY_BYTES / share.max(1))).max(PART_ROWS_MIN),
            },
            _ => PartSize::WHOLE,
        }
    }

    /// Whether `bytes` and `rows` are past a part.
    fn passed(&self, bytes: usize, rows: usize) -> bool {
        bytes > self.bytes || rows > self.rows
    }
}

/// A statement's rows: one batch in memory, or a spool file.
pub enum Rows {
    Memory(RecordBatch),
    Spooled(Spool),
}

impl Rows {
    pub fn num_rows(&self) -> usize {
        match self {
            Rows::Memory(b) => b.num_rows(),
            Rows::Spooled(s) => s.rows,
        }
    }

    /// The batch, of rows held in memory.
    pub fn into_memory(self) -> Option<RecordBatch> {
        match self {
            Rows::Memory(b) => Some(b),
            Rows::Spooled(_) => None,
        }
    }

    /// The rows as one batch in memory, spooled ones read back, unless they take more than
    /// `max_bytes` of it (`None`, found before they are all read).
    pub fn read_back(self, max_bytes: usize) -> Result<Option<RecordBatch>> {
        let spool = match self {
            Rows::Memory(b) => return Ok(Some(b)),
            Rows::Spooled(spool) => spool,
        };
        let (mut batches, mut bytes) = (Vec::new(), 0usize);
        for part in spool.parts()? {
            let part = part?;
            bytes = bytes.saturating_add(part.get_array_memory_size());
            if bytes > max_bytes {
                return Ok(None);
            }
            batches.push(part);
        }
        Ok(Some(concat_batches(&spool.schema, &batches)?))
    }

    /// The rows in parts of about their `PartSize` at most, in the order they came.
    pub fn parts(&self) -> Result<Box<dyn Iterator<Item = Result<RecordBatch>> + Send + '_>> {
        match self {
            Rows::Memory(b) => Ok(Box::new(std::iter::once(Ok(b.clone())))),
            Rows::Spooled(s) => s.parts(),
        }
    }
}

/// Rows written to a temporary file, which goes when this does.
pub struct Spool {
    file: TempFile,
    schema: SchemaRef,
    rows: usize,
    size: PartSize,
}

impl Spool {
    /// The spooled rows in parts, read back one at a time.
    fn parts(&self) -> Result<Box<dyn Iterator<Item = Result<RecordBatch>> + Send + '_>> {
        let path = self.file.path();
        let file = File::open(path).map_err(|e| {
            Error::io(
                &e,
                format!("could not read spool file {}: {e}", path.display()),
            )
        })?;
        let reader = StreamReader::try_new(BufReader::with_capacity(1 << 20, file), None)?;
        Ok(Box::new(Parts {
            reader,
            schema: self.schema.clone(),
            size: self.size,
            next: None,
        }))
    }
}

/// A spool's batches gathered into parts of at most about its `PartSize` (a single larger
/// batch is a part of its own).
struct Parts {
    reader: StreamReader<BufReader<File>>,
    schema: SchemaRef,
    size: PartSize,
    /// A batch read that did not fit the last part.
    next: Option<RecordBatch>,
}

impl Iterator for Parts {
    type Item = Result<RecordBatch>;

    /// Reads the next part off the async workers: the reads wait on the disk.
    fn next(&mut self) -> Option<Result<RecordBatch>> {
        crate::blocking(|| self.read_part())
    }
}

impl Parts {
    fn read_part(&mut self) -> Option<Result<RecordBatch>> {
        let mut batches: Vec<RecordBatch> = self.next.take().into_iter().collect();
        let mut bytes: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
        let mut rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        loop {
            match self.reader.next() {
                None => break,
                Some(Err(e)) => return Some(Err(e.into())),
                Some(Ok(batch)) => {
                    let size = batch.get_array_memory_size();
                    let full = self.size.passed(bytes + size, rows + batch.num_rows());
                    if !batches.is_empty() && full {
                        self.next = Some(batch);
                        break;
                    }
                    bytes += size;
                    rows += batch.num_rows();
                    batches.push(batch);
                }
            }
        }
        if batches.is_empty() {
            return None;
        }
        Some(concat_batches(&self.schema, &batches).map_err(Into::into))
    }
}

/// The rows of one statement as they come (`push`), in memory until they pass a part's size,
/// then in a spool file.
pub struct Gather {
    schema: SchemaRef,
    disk: Arc<TempDisk>,
    size: PartSize,
    batches: Vec<RecordBatch>,
    bytes: usize,
    rows: usize,
    file: Option<(Spool, StreamWriter<BufWriter<Charged>>)>,
}

impl Gather {
    /// Gathers rows of `schema`, spooling them into a file of `disk` once they pass `size`.
    pub fn new(schema: SchemaRef, disk: &Arc<TempDisk>, size: PartSize) -> Gather {
        Gather {
            schema,
            disk: disk.clone(),
            size,
            batches: Vec::new(),
            bytes: 0,
            rows: 0,
            file: None,
        }
    }

    pub fn push(&mut self, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.rows += batch.num_rows();
        if let Some((spool, writer)) = &mut self.file {
            return write(spool, writer, &batch);
        }
        self.bytes += batch.get_array_memory_size();
        self.batches.push(batch);
        if self.size.passed(self.bytes, self.rows) {
            let mut file = self.create()?;
            for batch in std::mem::take(&mut self.batches) {
                write(&file.0, &mut file.1, &batch)?;
            }
            self.file = Some(file);
        }
        Ok(())
    }

    fn create(&self) -> Result<(Spool, StreamWriter<BufWriter<Charged>>)> {
        let file = self.disk.create("arrows")?;
        let writer = file.writer()?;
        let spool = Spool {
            file,
            schema: self.schema.clone(),
            rows: 0,
            size: self.size,
        };
        let writer = StreamWriter::try_new(BufWriter::with_capacity(1 << 20, writer), &self.schema)
            .map_err(|e| spool_error(&spool, e))?;
        Ok((spool, writer))
    }

    /// The rows gathered: one batch, or the spool (written whole: a spool is read only by
    /// this process, and a crash clears it).
    pub fn finish(self) -> Result<Rows> {
        match self.file {
            None => Ok(Rows::Memory(concat_batches(&self.schema, &self.batches)?)),
            Some((mut spool, mut writer)) => {
                crate::blocking(|| writer.finish()).map_err(|e| spool_error(&spool, e))?;
                spool.rows = self.rows;
                Ok(Rows::Spooled(spool))
            }
        }
    }
}

/// Appends `batch` to a spool file, off the async workers.
fn write(
    spool: &Spool,
    writer: &mut StreamWriter<BufWriter<Charged>>,
    batch: &RecordBatch,
) -> Result<()> {
    crate::blocking(|| writer.write(batch)).map_err(|e| spool_error(spool, e))
}

/// A spool write's error; one the temporary files' budget refused is carried through the
/// `IoError` (`Error::io`).
fn spool_error(spool: &Spool, e: ArrowError) -> Error {
    let message = format!(
        "could not write spool file {}: {e}",
        spool.file.path().display()
    );
    match &e {
        ArrowError::IoError(_, io) => Error::io(io, message),
        _ => Error::internal(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    /// The rows' schema: an id and a text of about 200 bytes (`batch`).
    fn id_and_text() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Utf8, false),
        ]))
    }

    fn batch(schema: &SchemaRef, from: i64, rows: i64) -> RecordBatch {
        let ids = Int64Array::from_iter_values(from..from + rows);
        let text = StringArray::from_iter_values(
            (from..from + rows).map(|i| "y".repeat(200 + (i % 3) as usize)),
        );
        RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), Arc::new(text)]).unwrap()
    }

    /// Gathers `total` rows of `schema` in batches of `batch_rows` into parts of `size`:
    /// spooled, read back in order in more than one part, each within `size` and a batch,
    /// and their file gone with them.
    fn spool_and_read_back(size: PartSize, total: i64, batch_rows: i64) {
        let dir = tempfile::tempdir().unwrap();
        let disk = TempDisk::new(dir.path(), u64::MAX).unwrap();
        let schema = id_and_text();
        let mut few = Gather::new(schema.clone(), &disk, size);
        few.push(batch(&schema, 0, 10)).unwrap();
        assert!(matches!(few.finish().unwrap(), Rows::Memory(b) if b.num_rows() == 10));
        let mut many = Gather::new(schema.clone(), &disk, size);
        let one_batch = batch(&schema, 0, batch_rows).get_array_memory_size();
        for from in (0..total).step_by(batch_rows as usize) {
            many.push(batch(&schema, from, batch_rows.min(total - from)))
                .unwrap();
        }
        let rows = many.finish().unwrap();
        assert!(matches!(rows, Rows::Spooled(_)));
        assert_eq!(rows.num_rows(), total as usize);
        let mut next = 0;
        let mut parts = 0;
        for part in rows.parts().unwrap() {
            let part = part.unwrap();
            assert!(part.get_array_memory_size() <= size.bytes + one_batch);
            assert!(part.num_rows() <= size.rows.max(batch_rows as usize));
            let ids = part
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            for id in ids.values() {
                assert_eq!(*id, next);
                next += 1;
            }
            parts += 1;
        }
        assert_eq!((next, parts > 1), (total, true));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(disk.used() > 0);
        drop(rows);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "the spool goes with its rows"
        );
        assert_eq!(disk.used(), 0);
    }

    #[test]
    fn rows_past_the_memory_bound_go_to_a_file_and_come_back_in_order() {
        spool_and_read_back(PartSize::WHOLE, 400_000, 8192);
    }

    #[test]
    fn a_smaller_share_spools_sooner_in_smaller_parts() {
        let size = PartSize::within(Some(1 << 20));
        assert_eq!((size.bytes, size.rows), (1 << 20, 4096));
        spool_and_read_back(size, 20_000, 1000);
        // Rows within the share stay in memory, past it they go to the spool: 1,000 rows of
        // about 200 bytes are past a share of 64 kB, not past the whole of `MEMORY_BYTES`.
        let dir = tempfile::tempdir().unwrap();
        let disk = TempDisk::new(dir.path(), u64::MAX).unwrap();
        let schema = id_and_text();
        for (share, spooled) in [(None, false), (Some(64 << 10), true)] {
            let mut gather = Gather::new(schema.clone(), &disk, PartSize::within(share));
            gather.push(batch(&schema, 0, 1000)).unwrap();
            let rows = gather.finish().unwrap();
            assert_eq!(matches!(rows, Rows::Spooled(_)), spooled, "share {share:?}");
        }
        assert_eq!(PartSize::within(Some(1)).rows, PART_ROWS_MIN);
        assert_eq!(PartSize::within(Some(64 << 20)), PartSize::WHOLE);
    }
}
