//! The data directory's lock: one server per data directory. A second server started on a
//! directory in use refuses to start and names the holder, before it reads or writes
//! anything there.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::error::{Error, ErrorKind, Result};

/// The lock file, inside the data directory.
const LOCK_FILE: &str = "weir.lock";

/// Holds the data directory's lock until dropped (or the process ends, however it ends: the
/// operating system releases the lock with the file).
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
    /// Dropped after the file (fields drop in order): set once the lock is released.
    released: crate::DropFlag,
}

impl DataDirLock {
    /// Takes the lock of `dir` (created if missing) for this process, and writes who holds
    /// it (`holder`, with the process id) into the lock file for a second server to name.
    pub fn acquire(dir: &Path, holder: &str) -> Result<DataDirLock> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                // Bounded: the holder writes one line.
                let mut who = String::new();
                let _ = (&mut file).take(4096).read_to_string(&mut who);
                let who = who.trim();
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "data directory {} is in use by another Weir server ({})",
                        dir.display(),
                        if who.is_empty() {
                            "holder unknown"
                        } else {
                            who
                        }
                    ),
                ));
            }
            Err(TryLockError::Error(e)) => {
                return Err(Error::unavailable(format!(
                    "cannot lock data directory {}: {e}",
                    dir.display()
                )))
            }
        }
        file.set_len(0)?;
        file.seek(SeekFrom::Start(0))?;
        writeln!(file, "pid {}, {holder}", std::process::id())?;
        file.sync_all()?;
        Ok(DataDirLock {
            _file: file,
            released: crate::DropFlag::default(),
        })
    }

    /// Tells, once this lock is dropped, whether it has been released (for a restart in the
    /// same process to wait for).
    pub fn released(&self) -> crate::Dropped {
        self.released.watch()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_and_told_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path(), "listening on 127.0.0.1:1").unwrap();
        let err = DataDirLock::acquire(dir.path(), "listening on 127.0.0.1:2").unwrap_err();
        let pid = std::process::id();
        assert!(
            err.message.contains(&format!(
                "in use by another Weir server (pid {pid}, listening on 127.0.0.1:1)"
            )),
            "{}",
            err.message
        );
        let released = first.released();
        assert!(!released.is_dropped());
        drop(first);
        assert!(released.is_dropped());
        DataDirLock::acquire(dir.path(), "listening on 127.0.0.1:2").unwrap();
    }
}
