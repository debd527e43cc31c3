//! The file connector: CSV files read in order, one after the other (a path names one file, or
//! a directory whose `*.csv` files are read in name order). Rows are parsed into the source's
//! columns by Arrow's CSV decoder. The source's position is the file and byte where the last
//! row it fed ends (`Position`): a restart seeks there. A reader started at an offset alone
//! (from a checkpoint written before positions were kept) skips that many rows.
//!
//! A file's rows are read again after a restart and for a view created later (from the first
//! row), so they must be the same rows: a source records each
//! file it starts reading, with its size, modification time and first row, in its ledger
//! (`FileLedger`), before any of its rows go out; a reader opened again checks the files before
//! its offset against it, and refuses a file deleted, rewritten or replaced, or a new one that
//! sorts before those read, instead of reading other rows than the first time.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::csv::reader::{Decoder, ReaderBuilder};
use datafusion::arrow::datatypes::SchemaRef;

use serde::{Deserialize, Serialize};

use super::{Keep, Options, Start};
use crate::catalog::{ColumnDef, ObjectId, SourceDef};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::{Batches, Splits, FEED_ROWS_MAX};

/// The files of `path`, in the order they are read.
pub fn files(path: &Path) -> Result<Vec<PathBuf>> {
    let missing = |e: std::io::Error| {
        Error::new(
            ErrorKind::UndefinedFile,
            format!("could not open \"{}\": {e}", path.display()),
        )
    };
    let meta = std::fs::metadata(path).map_err(missing)?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    if !meta.is_dir() {
        return Err(not_a_file(path));
    }
    let mut found = Vec::new();
    for entry in std::fs::read_dir(path).map_err(missing)? {
        let p = entry?.path();
        if p.extension().is_some_and(|e| e == "csv") && p.is_file() {
            found.push(p);
        }
    }
    found.sort();
    if found.is_empty() {
        return Err(Error::new(
            ErrorKind::UndefinedFile,
            format!("directory \"{}\" holds no .csv file", path.display()),
        ));
    }
    Ok(found)
}

/// A FIFO, a device or a socket: reading one could wait for ever (a FIFO without a writer)
/// or never end (`/dev/zero`).
fn not_a_file(path: &Path) -> Error {
    Error::new(
        ErrorKind::WrongObjectType,
        format!("\"{}\" is not a regular file or directory", path.display()),
    )
    .with_hint("A file source reads regular files: a CSV file, or a directory of them.")
}

/// Opens a file to read without waiting (a FIFO put in a file's place since it was listed
/// would make a plain open wait for a writer), and only if it is a regular file.
fn open_regular(path: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            Error::new(
                ErrorKind::UndefinedFile,
                format!("could not open \"{}\": {e}", path.display()),
            )
        })?;
    if !file.metadata()?.is_file() {
        return Err(not_a_file(path));
    }
    Ok(file)
}

/// A file a source has started reading: what it was then, and the source's row it starts at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    name: String,
    size: u64,
    modified_ns: u64,
    first_row: u64,
}

impl Stamp {
    fn of(path: &Path, meta: &std::fs::Metadata, first_row: u64) -> Stamp {
        let modified_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as u64);
        Stamp {
            name: name_of(path),
            size: meta.len(),
            modified_ns,
            first_row,
        }
    }
}

fn name_of(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// The files a file source has started reading, in order, kept in the data directory
/// (`<data_dir>/sources/<id>.files.json`). The source's own reader records a file before any
/// of its rows go out; a reader that reads the stream again (for a view created later) only
/// checks.
pub struct FileLedger {
    path: PathBuf,
    stamps: Vec<Stamp>,
    record: bool,
}

impl FileLedger {
    /// Source `id`'s ledger in `dir` (empty if it has none yet); `record` for the source's own
    /// reader.
    pub fn open(dir: &Path, id: u32, record: bool) -> Result<FileLedger> {
        let path = dir.join(format!("{id}.files.json"));
        let stamps = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                Error::new(
                    ErrorKind::DataCorruption,
                    format!("cannot read {}: {e}", path.display()),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        Ok(FileLedger {
            path,
            stamps,
            record,
        })
    }

    /// Deletes source `id`'s ledger in `dir` (a dropped source).
    pub fn remove(dir: &Path, id: u32) -> Result<()> {
        match std::fs::remove_file(dir.join(format!("{id}.files.json"))) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// Checks that `files` begin with the files the source started reading before row
    /// `below`, unchanged; a recording ledger then forgets the others, which the reader
    /// records again as it reaches them.
    fn check(&mut self, files: &[PathBuf], below: u64) -> Result<()> {
        let changed = |what: String| {
            Error::new(ErrorKind::ObjectNotInPrerequisiteState, what).with_hint(
                "A file source reads each file once, in name order: add new files with names \
                 that sort after those already read, and do not change or delete a file once \
                 it is there (write it elsewhere and rename it into the directory). Recreate \
                 the source to read its files from the start.",
            )
        };
        let read = self.stamps.iter().take_while(|s| s.first_row < below);
        for (i, stamp) in read.enumerate() {
            let found = files.get(i).map(|f| (f, name_of(f)));
            let Some((file, name)) = found.filter(|(_, n)| *n == stamp.name) else {
                let there = files.iter().any(|f| name_of(f) == stamp.name);
                return Err(changed(match (there, files.get(i)) {
                    (true, Some(f)) => format!(
                        "file \"{}\" sorts before \"{}\", which was read before it: its rows \
                         would come out of order",
                        name_of(f),
                        stamp.name
                    ),
                    _ => format!(
                        "file \"{}\", read from row {}, is gone",
                        stamp.name, stamp.first_row
                    ),
                }));
            };
            let meta = std::fs::metadata(file)?;
            let now = Stamp::of(file, &meta, stamp.first_row);
            if now != *stamp {
                return Err(changed(format!(
                    "file \"{name}\" changed since it was read ({} bytes then, {} now{})",
                    stamp.size,
                    now.size,
                    if now.modified_ns != stamp.modified_ns {
                        ", and a new modification time"
                    } else {
                        ""
                    }
                )));
            }
        }
        if self.record {
            let kept = self
                .stamps
                .iter()
                .take_while(|s| s.first_row < below)
                .count();
            if kept < self.stamps.len() {
                self.stamps.truncate(kept);
                self.save()?;
            }
        }
        Ok(())
    }

    /// Records file number `index` of the source, opened as `file` at source row `first_row`,
    /// if it is the next one not yet recorded; synced before it returns.
    fn reached(&mut self, index: usize, path: &Path, file: &File, first_row: u64) -> Result<()> {
        if !self.record || index != self.stamps.len() {
            return Ok(());
        }
        self.stamps
            .push(Stamp::of(path, &file.metadata()?, first_row));
        self.save()
    }

    /// Writes the ledger whole: a synced temporary file renamed into place.
    fn save(&self) -> Result<()> {
        let tmp = self.path.with_extension("json.tmp");
        let bytes = serde_json::to_vec(&self.stamps)
            .map_err(|e| Error::internal(format!("cannot encode a source's files: {e}")))?;
        let written = (|| -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            std::io::Write::write_all(&mut f, &bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            if let Some(dir) = self.path.parent() {
                File::open(dir)?.sync_all()?;
            }
            Ok(())
        })();
        written.map_err(|e| Error::io(&e, format!("cannot write {}: {e}", self.path.display())))
    }
}

/// `connector = 'file'`: `path` names a CSV file or a directory of them; `header = true` when
/// each file's first line names the columns; `format` may only be `csv`. The columns must be
/// declared.
pub struct Files;

/// A file source's options.
struct Config {
    path: String,
    header: bool,
}

impl Config {
    fn read(options: &mut Options) -> Result<Config> {
        let path = options
            .take("path")
            .ok_or_else(|| Error::new(ErrorKind::InvalidParameter, "a file source needs a path"))?;
        // `FORMAT PLAIN ENCODE CSV`; `format = 'csv'` as before that clause.
        let format = options.take("format").map(|f| f.to_lowercase());
        let encode = options.take("encode").map(|e| e.to_lowercase());
        match (format.as_deref(), encode.as_deref()) {
            (None | Some("plain"), None | Some("csv")) | (Some("csv"), None) => {}
            _ => {
                return Err(Error::not_supported(format!(
                    "file sources read FORMAT PLAIN ENCODE CSV, not FORMAT {} ENCODE {}",
                    format.as_deref().unwrap_or("plain").to_uppercase(),
                    encode.as_deref().unwrap_or("csv").to_uppercase()
                ))
                .with_hint("Use FORMAT PLAIN ENCODE CSV."))
            }
        }
        let header = super::flag("header", options.take("header"))?.unwrap_or(false);
        Ok(Config { path, header })
    }
}

/// The one split of a file source: its files are read in order, one after the other.
const SPLIT: &str = "files";

/// Where a file source resumes: in file `file` (its name), at byte `byte`, the end of the
/// last row it returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Position {
    file: String,
    byte: u64,
}

impl super::Connector for Files {
    fn name(&self) -> &'static str {
        "file"
    }

    fn create(
        &self,
        options: &mut Options,
        declared: Vec<ColumnDef>,
        table: Option<&[usize]>,
    ) -> Result<(BTreeMap<String, String>, Vec<ColumnDef>)> {
        super::sources_only("file", table)?;
        let config = Config::read(options)?;
        if declared.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidParameter,
                "a file source needs its columns declared",
            ));
        }
        files(Path::new(&config.path))?;
        let kept = BTreeMap::from([
            ("path".to_string(), config.path),
            ("header".to_string(), config.header.to_string()),
        ]);
        Ok((kept, declared))
    }

    fn open(
        &self,
        def: &SourceDef,
        start: Start<'_>,
        keep: Option<Keep<'_>>,
    ) -> Result<Box<dyn super::Reader>> {
        let config = Config::read(&mut Options::kept(&def.connector.options))?;
        let ledger = keep
            .map(|k| Ok::<_, Error>((FileLedger::open(k.dir, def.id, k.own)?, k.checked)))
            .transpose()?;
        let reader = FileReader::open(
            Path::new(&config.path),
            config.header,
            def.schema(),
            start,
            ledger,
        )?;
        Ok(Box::new(reader))
    }

    fn forget(&self, dir: &Path, id: ObjectId) -> Result<()> {
        FileLedger::remove(dir, id)
    }
}

/// A file being read: its index among the source's files, its bytes and the decoder of its
/// rows, and the bytes decoded so far.
struct Current {
    index: usize,
    input: BufReader<File>,
    decoder: Decoder,
    byte: u64,
}

pub struct FileReader {
    files: Vec<PathBuf>,
    ledger: Option<FileLedger>,
    current: Option<Current>,
    next_file: usize,
    header: bool,
    schema: SchemaRef,
    /// Rows still to skip before the first one returned (a start by row count).
    skip: u64,
    /// Rows read so far, skipped ones included.
    rows: u64,
    /// The file and byte where the last row returned ends.
    at: Option<(usize, u64)>,
    /// Rows per batch at most.
    batch_rows: usize,
}

impl FileReader {
    /// A reader of the files at `path` from `start`. With a ledger, the files before its row
    /// (the start, or the rows to be read again) must be those it recorded.
    fn open(
        path: &Path,
        header: bool,
        schema: SchemaRef,
        start: Start<'_>,
        mut ledger: Option<(FileLedger, u64)>,
    ) -> Result<FileReader> {
        let files = files(path)?;
        if let Some((l, checked)) = &mut ledger {
            l.check(&files, *checked)?;
        }
        let mut reader = FileReader {
            files,
            ledger: ledger.map(|(l, _)| l),
            current: None,
            next_file: 0,
            header,
            schema,
            skip: start.rows,
            rows: 0,
            at: None,
            batch_rows: FEED_ROWS_MAX,
        };
        let position = start.splits.and_then(|s| s.get(SPLIT));
        if let Some(position) = position {
            let position: Position = serde_json::from_value(position.clone()).map_err(|e| {
                Error::new(
                    ErrorKind::DataCorruption,
                    format!("a file source's position does not read: {e}"),
                )
            })?;
            reader.resume(&position, start.rows)?;
        }
        Ok(reader)
    }

    /// Goes to `position`, after the source's first `rows` rows.
    fn resume(&mut self, position: &Position, rows: u64) -> Result<()> {
        let index = (self.files.iter())
            .position(|f| name_of(f) == position.file)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::ObjectNotInPrerequisiteState,
                    format!(
                        "file \"{}\", where the source had read to, is gone",
                        position.file
                    ),
                )
            })?;
        let mut file = open_regular(&self.files[index])?;
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(position.byte))?;
        self.current = Some(self.decode(index, file, position.byte));
        self.next_file = index + 1;
        (self.skip, self.rows) = (0, rows);
        self.at = Some((index, position.byte));
        Ok(())
    }

    /// Decodes file number `index` from its byte `byte` on (only the start has a header).
    fn decode(&self, index: usize, file: File, byte: u64) -> Current {
        let decoder = ReaderBuilder::new(self.schema.clone())
            .with_header(self.header && byte == 0)
            .with_batch_size(self.batch_rows)
            .build_decoder();
        Current {
            index,
            input: BufReader::with_capacity(1 << 20, file),
            decoder,
            byte,
        }
    }

    /// The next batch of the files, skipped rows included.
    fn read(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            if self.current.is_none() {
                let Some(path) = self.files.get(self.next_file) else {
                    return Ok(None);
                };
                let file = open_regular(path)?;
                if let Some(l) = &mut self.ledger {
                    l.reached(self.next_file, path, &file, self.rows)?;
                }
                self.current = Some(self.decode(self.next_file, file, 0));
                self.next_file += 1;
            }
            let Some(current) = &mut self.current else {
                continue;
            };
            let bad = |e: &dyn std::fmt::Display| {
                Error::new(
                    ErrorKind::InvalidText,
                    format!("{}: {e}", self.files[current.index].display()),
                )
            };
            // Decodes until a batch is full (the bytes decoded then end at a row's end) or the
            // file ends.
            let batch = loop {
                let bytes = std::io::BufRead::fill_buf(&mut current.input)?;
                if bytes.is_empty() {
                    break current.decoder.flush().map_err(|e| bad(&e))?;
                }
                let decoded = current.decoder.decode(bytes).map_err(|e| bad(&e))?;
                std::io::BufRead::consume(&mut current.input, decoded);
                current.byte += decoded as u64;
                if decoded == 0 || current.decoder.capacity() == 0 {
                    break current.decoder.flush().map_err(|e| bad(&e))?;
                }
            };
            match batch {
                Some(batch) => {
                    self.at = Some((current.index, current.byte));
                    return Ok(Some(batch));
                }
                None => self.current = None,
            }
        }
    }

    /// The next rows after those skipped.
    fn next(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            let Some(batch) = self.read()? else {
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

#[async_trait::async_trait]
impl Batches for FileReader {
    /// Read on the calling thread, which hands its other tasks to another first: a slow disk
    /// holds up only this source.
    async fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        crate::blocking(|| self.next())
    }
}

impl super::Reader for FileReader {
    fn splits(&self) -> Option<Splits> {
        let (index, byte) = self.at?;
        let position = Position {
            file: name_of(&self.files[index]),
            byte,
        };
        let value = serde_json::to_value(position).ok()?;
        Some(Arc::new(BTreeMap::from([(SPLIT.to_string(), value)])))
    }
}

#[cfg(test)]
mod tests {
    use super::super::Reader;
    use super::*;
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};

    fn keys(batch: &RecordBatch) -> Vec<i64> {
        batch
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec()
    }

    /// Every key from `start` on, and after each batch the rows so far and the position.
    fn read_from(
        dir: &Path,
        header: bool,
        start: Start<'_>,
    ) -> (Vec<i64>, Vec<(u64, Option<Splits>)>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let mut r = FileReader::open(dir, header, schema, start, None).unwrap();
        r.batch_rows = 2;
        let (mut all, mut positions) = (Vec::new(), Vec::new());
        let mut rows = start.rows;
        while let Some(b) = r.next().unwrap() {
            all.extend(keys(&b));
            rows += b.num_rows() as u64;
            positions.push((rows, r.splits()));
        }
        (all, positions)
    }

    #[test]
    fn reads_files_in_name_order_from_any_offset_or_position() {
        for (header, newline) in [(false, "\n"), (true, "\r\n")] {
            let dir = tempfile::tempdir().unwrap();
            let file = |name: &str, rows: &[&str]| {
                let mut text = if header {
                    format!("k,s{newline}")
                } else {
                    String::new()
                };
                for row in rows {
                    text.push_str(row);
                    text.push_str(newline);
                }
                std::fs::write(dir.path().join(name), text).unwrap();
            };
            file("part-1.csv", &["3,c", "4,d", "5,e"]);
            file("part-0.csv", &["1,a", "2,b"]);
            std::fs::write(dir.path().join("notes.txt"), "not read").unwrap();
            let (all, positions) = read_from(dir.path(), header, Start::FIRST);
            assert_eq!(all, vec![1, 2, 3, 4, 5]);
            // Two full batches, then the end of part-1 with one row.
            assert_eq!(positions.len(), 3, "{positions:?}");
            for (rows, splits) in &positions {
                let start = Start {
                    rows: *rows,
                    splits: splits.as_deref(),
                };
                let (rest, _) = read_from(dir.path(), header, start);
                assert_eq!(rest, all[*rows as usize..], "from {splits:?}");
                let by_count = Start {
                    rows: *rows,
                    splits: None,
                };
                assert_eq!(read_from(dir.path(), header, by_count).0, rest);
            }
        }
        assert!(files(Path::new("/nonexistent/weir")).is_err());
    }
}
