//! The file connector: CSV files read in order, one after the other (a path names one file, or
//! a directory whose `*.csv` files are read in name order). Rows are parsed into the source's
//! columns by Arrow's CSV reader; the offset is the number of rows read, and a reader opened at
//! an offset skips that many.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::csv::reader::{BufReader as CsvReader, ReaderBuilder};
use datafusion::arrow::datatypes::SchemaRef;

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

pub struct FileReader {
    files: Vec<PathBuf>,
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
    pub fn open(path: &Path, header: bool, schema: SchemaRef, offset: u64) -> Result<FileReader> {
        Ok(FileReader {
            files: files(path)?,
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
            let mut r = FileReader::open(dir.path(), false, schema.clone(), offset).unwrap();
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
