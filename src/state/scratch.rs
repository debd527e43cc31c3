//! A scratch key space on disk for one statement: a RocksDB of its own in a directory that
//! goes with it, never checkpointed. A large write checks its primary keys against the keys
//! it wrote before, which can be more than memory holds.

use std::path::{Path, PathBuf};

use rocksdb::{WriteBatch, WriteOptions, DB};

use super::{db_options, storage_error};
use crate::error::Result;

/// Memtable of a scratch store: small, as its keys are read back at once.
const WRITE_BUFFER_BYTES: usize = 16 << 20;

pub struct Scratch {
    db: Option<DB>,
    dir: PathBuf,
}

impl Scratch {
    /// Creates an empty scratch store in `dir`, which must not exist.
    pub fn create(dir: &Path) -> Result<Scratch> {
        let mut opts = db_options();
        opts.create_if_missing(true);
        opts.set_write_buffer_size(WRITE_BUFFER_BYTES);
        let db = crate::blocking(|| DB::open(&opts, dir)).map_err(storage_error)?;
        Ok(Scratch {
            db: Some(db),
            dir: dir.to_path_buf(),
        })
    }

    fn db(&self) -> &DB {
        self.db.as_ref().expect("open until dropped")
    }

    /// The byte kept for `key`, if any.
    pub fn get(&self, key: &[u8]) -> Result<Option<u8>> {
        let value = self.db().get_pinned(key).map_err(storage_error)?;
        Ok(value.and_then(|v| v.first().copied()))
    }

    /// Keeps a byte for each key (replacing what was kept).
    pub fn put<'a>(&self, entries: impl IntoIterator<Item = (&'a [u8], u8)>) -> Result<()> {
        let mut batch = WriteBatch::default();
        for (key, value) in entries {
            batch.put(key, [value]);
        }
        let mut opts = WriteOptions::default();
        opts.disable_wal(true);
        crate::blocking(|| self.db().write_opt(batch, &opts)).map_err(storage_error)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        drop(self.db.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_a_byte_per_key_and_goes_with_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.keys");
        let s = Scratch::create(&path).unwrap();
        assert_eq!(s.get(b"a").unwrap(), None);
        s.put([(b"a".as_slice(), 1), (b"b".as_slice(), 2)]).unwrap();
        s.put([(b"a".as_slice(), 3)]).unwrap();
        assert_eq!(
            (s.get(b"a").unwrap(), s.get(b"b").unwrap()),
            (Some(3), Some(2))
        );
        assert!(path.exists());
        drop(s);
        assert!(!path.exists());
    }
}
