//! The file connector: CSV files read in order, one after the other (a path names one file, or
//! a directory whose `*.csv` files are read in name order). Rows are parsed into the source's
//! columns by Arrow's CSV reader; the offset is the number of rows read, and a reader opened at
//! an offset skips that many.
//!
//! A file's rows are read again after a restart (up to the checkpoint's offset) and for a view
//! created later (from the first row), so they must be the same rows: a source records each
//! file it starts reading, with its size, modification time and first row, in its ledger
//! (`FileLedger`), before any of its rows go out; a reader opened again checks the files before
//! its offset against it, and refuses a file deleted, rewritten or replaced, or a new one that
//! sorts before those read, instead of reading other rows than the first time.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::csv::reader::{BufReader as CsvReader, ReaderBuilder};
use datafusion::arrow::datatypes::SchemaRef;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

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

pub struct FileReader {
    files: Vec<PathBuf>,
    ledger: Option<FileLedger>,
    /// The file being read (an index into `files`) and its reader.
    current: Option<(usize, CsvReader<BufReader<File>>)>,
    next_file: usize,
    header: bool,
    schema: SchemaRef,
    /// Rows still to skip before the first one returned (the offset opened at).
    skip: u64,
    /// Rows read so far, skipped ones included.
    rows: u64,
}

impl FileReader {
    /// A reader of the files at `path` from row `offset` on. With a ledger, the files before
    /// row `checked` (the offset, or the rows to be read again) must be those it recorded.
    pub fn open(
        path: &Path,
        header: bool,
        schema: SchemaRef,
        (offset, checked): (u64, u64),
        mut ledger: Option<FileLedger>,
    ) -> Result<FileReader> {
        let files = files(path)?;
        if let Some(l) = &mut ledger {
            l.check(&files, checked)?;
        }
        Ok(FileReader {
            files,
            ledger,
            current: None,
            next_file: 0,
            header,
            schema,
            skip: offset,
            rows: 0,
        })
    }

    /// The next batch of the files, at most `rows_max` rows, skipped rows included.
    fn read(&mut self, rows_max: usize) -> Result<Option<RecordBatch>> {
        loop {
            if self.current.is_none() {
                let Some(path) = self.files.get(self.next_file) else {
                    return Ok(None);
                };
                let file = open_regular(path)?;
                if let Some(l) = &mut self.ledger {
                    l.reached(self.next_file, path, &file, self.rows)?;
                }
                let reader = ReaderBuilder::new(self.schema.clone())
                    .with_header(self.header)
                    .with_batch_size(rows_max)
                    .build_buffered(BufReader::with_capacity(1 << 20, file))?;
                self.current = Some((self.next_file, reader));
                self.next_file += 1;
            }
            let Some((index, reader)) = &mut self.current else {
                continue;
            };
            match reader.next() {
                Some(Ok(batch)) => return Ok(Some(batch)),
                Some(Err(e)) => {
                    return Err(Error::new(
                        ErrorKind::InvalidText,
                        format!("{}: {e}", self.files[*index].display()),
                    ))
                }
                None => self.current = None,
            }
        }
    }
}

impl super::Reader for FileReader {
    fn next_batch(&mut self, rows_max: usize) -> Result<Option<RecordBatch>> {
        loop {
            let Some(batch) = self.read(rows_max)? else {
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

    fn position(&self) -> u64 {
        self.rows
    }
}

#[cfg(test)]
mod tests {
    use super::super::Reader;
    use super::*;
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use std::sync::Arc;

    #[test]
    fn reads_files_in_name_order_from_any_offset() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("part-1.csv"), "3,c\n4,d\n5,e\n").unwrap();
        std::fs::write(dir.path().join("part-0.csv"), "1,a\n2,b\n").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not read").unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let read = |offset| {
            let mut r = FileReader::open(dir.path(), false, schema.clone(), (offset, offset), None)
                .unwrap();
            let mut keys = Vec::new();
            while let Some(b) = r.next_batch(2).unwrap() {
                keys.extend(
                    b.column(0)
                        .as_primitive::<Int64Type>()
                        .values()
                        .iter()
                        .copied(),
                );
            }
            keys
        };
        assert_eq!(read(0), vec![1, 2, 3, 4, 5]);
        assert_eq!(read(3), vec![4, 5]);
        assert_eq!(read(5), Vec::<i64>::new());
        assert!(files(&dir.path().join("missing")).is_err());
    }
}
