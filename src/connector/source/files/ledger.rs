//! The files a files source has started reading, in order, kept in the data directory
//! (`<data_dir>/sources/<id>.files.json`): a file's rows are read again after a restart and for
//! a view created later, so they must be the same rows. The source's own reader records a file
//! (name, size, modification time, the source's row it starts at) before any of its rows go
//! out; a reader opened again checks the files before its row against it, and refuses a file
//! deleted, rewritten or replaced, or a new one that sorts before those read.

use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::store::Listed;
use crate::error::{Error, ErrorKind, Result};

/// A file a source has started reading: what it was then, and the source's row it starts at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    name: String,
    size: u64,
    modified_ns: u64,
    first_row: u64,
}

impl Stamp {
    fn of(file: &Listed, first_row: u64) -> Stamp {
        Stamp {
            name: file.name.clone(),
            size: file.size,
            modified_ns: file.modified_ns,
            first_row,
        }
    }
}

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
    pub fn check(&mut self, files: &[Listed], below: u64) -> Result<()> {
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
            let Some(file) = files.get(i).filter(|f| f.name == stamp.name) else {
                let there = files.iter().any(|f| f.name == stamp.name);
                return Err(changed(match (there, files.get(i)) {
                    (true, Some(f)) => format!(
                        "file \"{}\" sorts before \"{}\", which was read before it: its rows \
                         would come out of order",
                        f.name, stamp.name
                    ),
                    _ => format!(
                        "file \"{}\", read from row {}, is gone",
                        stamp.name, stamp.first_row
                    ),
                }));
            };
            let now = Stamp::of(file, stamp.first_row);
            if now != *stamp {
                return Err(changed(format!(
                    "file \"{}\" changed since it was read ({} bytes then, {} now{})",
                    stamp.name,
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

    /// Records file number `index` of the source, `file`, at source row `first_row`, if it is
    /// the next one not yet recorded; synced before it returns.
    pub fn reached(&mut self, index: usize, file: &Listed, first_row: u64) -> Result<()> {
        if !self.record || index != self.stamps.len() {
            return Ok(());
        }
        self.stamps.push(Stamp::of(file, first_row));
        crate::blocking(|| self.save())
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
