//! Statements' temporary files under one disk budget (`temp_disk_limit`): what sorts,
//! aggregations and joins spill past their memory, and the spool of a statement's rows too
//! many for memory (`Gather`). Every byte written is counted before it is written; a write
//! that would take the files past the budget fails with 53400, and a file's bytes are given
//! back when it is deleted, which it is when the last of its users lets go of it.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use datafusion::error::DataFusionError;
use datafusion::execution::{SpillFile, SpillWriter, TempFileFactory};
use futures::{Stream, StreamExt};

use crate::error::{Error, ErrorKind, Result};

/// The directory of statements' temporary files and what they take of their budget.
pub struct TempDisk {
    dir: PathBuf,
    limit: u64,
    used: AtomicU64,
    /// Files are told apart by a number of the process.
    files: AtomicU64,
}

impl TempDisk {
    /// Temporary files in `dir` (created if need be), `limit` bytes of them at most.
    pub fn new(dir: &Path, limit: u64) -> Result<Arc<TempDisk>> {
        std::fs::create_dir_all(dir)?;
        Ok(Arc::new(TempDisk {
            dir: dir.to_path_buf(),
            limit,
            used: AtomicU64::new(0),
            files: AtomicU64::new(0),
        }))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The bytes every temporary file holds now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// A new path in the directory, whose name ends in `.{kind}`.
    pub fn path(&self, kind: &str) -> PathBuf {
        let n = self.files.fetch_add(1, Ordering::Relaxed);
        self.dir.join(format!("{n}.{kind}"))
    }

    /// A new empty file, whose name ends in `.{kind}`.
    pub fn create(self: &Arc<Self>, kind: &str) -> Result<TempFile> {
        let path = self.path(kind);
        let file = crate::blocking(|| File::create(&path)).map_err(|e| {
            Error::io(
                &e,
                format!("could not create temporary file {}: {e}", path.display()),
            )
        })?;
        Ok(TempFile {
            path,
            file,
            disk: self.clone(),
            written: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Counts `bytes` more, unless that would pass the limit.
    fn charge(&self, bytes: u64) -> std::io::Result<()> {
        let now = self.used.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if now > self.limit {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
            return Err(std::io::Error::other(exceeded(self.limit)));
        }
        Ok(())
    }
}

/// What a scratch store in the directory (which RocksDB writes, not Weir) takes of the budget:
/// set to its size on disk after each write, and given back when dropped.
pub struct Reserved {
    disk: Arc<TempDisk>,
    bytes: u64,
}

impl Reserved {
    pub fn new(disk: &Arc<TempDisk>) -> Reserved {
        Reserved {
            disk: disk.clone(),
            bytes: 0,
        }
    }

    /// Counts `bytes` in all instead of what was counted before: refused with 53400 (and
    /// what was counted kept) when more would pass the limit.
    pub fn set(&mut self, bytes: u64) -> Result<()> {
        if bytes > self.bytes {
            self.disk
                .charge(bytes - self.bytes)
                .map_err(|_| exceeded(self.disk.limit))?;
        } else {
            self.disk
                .used
                .fetch_sub(self.bytes - bytes, Ordering::Relaxed);
        }
        self.bytes = bytes;
        Ok(())
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.disk.used.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// What a write that would take statements' temporary files past `temp_disk_limit` fails with
/// (53400, as PostgreSQL's `temp_file_limit`), carried in the writer's `io::Error`.
fn exceeded(limit: u64) -> Error {
    Error::new(
        ErrorKind::ConfigurationLimitExceeded,
        format!(
            "temporary file size exceeds temp_disk_limit ({})",
            crate::sql::memory_text(limit)
        ),
    )
    .with_hint(
        "Statements' temporary files (spilled sorts and aggregations, spooled rows of large \
         writes) share temp_disk_limit of disk.",
    )
}

/// A temporary file: deleted, and its bytes given back, when it is dropped.
pub struct TempFile {
    path: PathBuf,
    file: File,
    disk: Arc<TempDisk>,
    written: Arc<AtomicU64>,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        self.disk
            .used
            .fetch_sub(self.written.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

impl TempFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A writer appending to the file, each write counted first.
    pub fn writer(&self) -> Result<Charged> {
        let file = self.file.try_clone().map_err(|e| {
            Error::io(
                &e,
                format!(
                    "could not write temporary file {}: {e}",
                    self.path.display()
                ),
            )
        })?;
        Ok(Charged {
            file,
            disk: self.disk.clone(),
            written: self.written.clone(),
        })
    }
}

/// Writes to a temporary file, counted against the budget before they are made.
pub struct Charged {
    file: File,
    disk: Arc<TempDisk>,
    written: Arc<AtomicU64>,
}

impl Write for Charged {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let bytes = buf.len() as u64;
        self.disk.charge(bytes)?;
        self.written.fetch_add(bytes, Ordering::Relaxed);
        self.file.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl SpillWriter for Charged {
    fn finish(&mut self) -> datafusion::error::Result<()> {
        Ok(self.file.flush()?)
    }
}

/// DataFusion's operators spill into the statements' temporary files.
pub struct Spills(pub Arc<TempDisk>);

impl TempFileFactory for Spills {
    fn create_temp_file(
        &self,
        _description: &str,
    ) -> datafusion::error::Result<Arc<dyn SpillFile>> {
        self.0
            .create("spill")
            .map(|f| Arc::new(f) as Arc<dyn SpillFile>)
            .map_err(|e| DataFusionError::External(Box::new(e)))
    }
}

impl SpillFile for TempFile {
    fn path(&self) -> Option<&Path> {
        Some(&self.path)
    }

    fn size(&self) -> Option<u64> {
        Some(self.written.load(Ordering::Relaxed))
    }

    fn read_stream(
        &self,
    ) -> datafusion::error::Result<
        Pin<Box<dyn Stream<Item = datafusion::error::Result<Bytes>> + Send>>,
    > {
        let path = self.path.clone();
        let open = futures::stream::once(async move { tokio::fs::File::open(path).await });
        Ok(Box::pin(open.flat_map(|file| {
            match file {
                Ok(file) => tokio_util::io::ReaderStream::with_capacity(file, 128 << 10)
                    .map(|r| r.map_err(DataFusionError::IoError))
                    .boxed(),
                Err(e) => {
                    futures::stream::once(async move { Err(DataFusionError::IoError(e)) }).boxed()
                }
            }
        })))
    }

    fn open_writer(&self) -> datafusion::error::Result<Box<dyn SpillWriter>> {
        self.writer()
            .map(|w| Box::new(w) as Box<dyn SpillWriter>)
            .map_err(|e| DataFusionError::External(Box::new(e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_past_the_limit_fail_and_a_dropped_file_gives_its_bytes_back() {
        let dir = tempfile::tempdir().unwrap();
        let disk = TempDisk::new(&dir.path().join("temp"), 1000).unwrap();
        let a = disk.create("spill").unwrap();
        let mut w = a.writer().unwrap();
        w.write_all(&[1; 600]).unwrap();
        let b = disk.create("arrows").unwrap();
        let e = b.writer().unwrap().write_all(&[2; 600]).unwrap_err();
        let refused = Error::from(e);
        assert_eq!(refused.kind, ErrorKind::ConfigurationLimitExceeded);
        assert_eq!(
            refused.message,
            "temporary file size exceeds temp_disk_limit (1000B)"
        );
        assert_eq!(disk.used(), 600);
        assert_eq!(std::fs::metadata(a.path()).unwrap().len(), 600);
        drop(w);
        drop(a);
        assert_eq!(disk.used(), 0);
        b.writer().unwrap().write_all(&[2; 600]).unwrap();
        assert_eq!(disk.used(), 600);
        let path = b.path().to_path_buf();
        drop(b);
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(disk.dir()).unwrap().count(), 0);
    }
}
