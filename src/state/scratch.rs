//! Scratch key spaces on disk for one statement or one transaction block: RocksDBs of their
//! own in directories that go with them, never checkpointed. A large write checks its primary
//! keys against the keys it wrote before (`Scratch`), and a transaction block keeps its
//! changes past memory as counts summed by key (`Tally`): either can be more than memory holds.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocksdb::{MergeOperands, Options, ReadOptions, WriteBatch, WriteOptions, DB};

use super::{db_options, scan_db, storage_error};
use crate::error::{Error, ErrorKind, Result};

/// Memtable of a scratch store: small, as its keys are read back at once.
const WRITE_BUFFER_BYTES: usize = 16 << 20;

/// A RocksDB of a statement's or a block's own, written without a log, and deleted with its
/// directory when dropped.
struct ScratchDb {
    db: Option<DB>,
    dir: PathBuf,
}

impl ScratchDb {
    /// Creates an empty store in `dir`, which must not exist, with `options` of its own.
    fn create(dir: &Path, options: impl FnOnce(&mut Options)) -> Result<ScratchDb> {
        let mut opts = db_options();
        opts.create_if_missing(true);
        opts.set_write_buffer_size(WRITE_BUFFER_BYTES);
        options(&mut opts);
        let db = crate::blocking(|| DB::open(&opts, dir)).map_err(storage_error)?;
        Ok(ScratchDb {
            db: Some(db),
            dir: dir.to_path_buf(),
        })
    }

    fn db(&self) -> &DB {
        self.db.as_ref().expect("open until dropped")
    }

    fn write(&self, batch: WriteBatch) -> Result<()> {
        let mut opts = WriteOptions::default();
        opts.disable_wal(true);
        crate::blocking(|| self.db().write_opt(batch, &opts)).map_err(storage_error)
    }

    /// The bytes of its files (it has no subdirectories).
    fn disk_bytes(&self) -> u64 {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        entries
            .filter_map(|e| e.ok()?.metadata().ok())
            .filter(|m| m.is_file())
            .map(|m| m.len())
            .sum()
    }
}

impl Drop for ScratchDb {
    fn drop(&mut self) {
        drop(self.db.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A byte per key: what a large write did to each primary key so far.
pub struct Scratch {
    db: ScratchDb,
}

impl Scratch {
    /// Creates an empty scratch store in `dir`, which must not exist.
    pub fn create(dir: &Path) -> Result<Scratch> {
        Ok(Scratch {
            db: ScratchDb::create(dir, |_| {})?,
        })
    }

    /// The byte kept for `key`, if any.
    pub fn get(&self, key: &[u8]) -> Result<Option<u8>> {
        let value = self.db.db().get_pinned(key).map_err(storage_error)?;
        Ok(value.and_then(|v| v.first().copied()))
    }

    /// Keeps a byte for each key (replacing what was kept).
    pub fn put<'a>(&self, entries: impl IntoIterator<Item = (&'a [u8], u8)>) -> Result<()> {
        let mut batch = WriteBatch::default();
        for (key, value) in entries {
            batch.put(key, [value]);
        }
        self.db.write(batch)
    }

    /// The bytes the store's files take on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.db.disk_bytes()
    }
}

/// Signed counts summed by key, on disk: each write adds to a key's count (a RocksDB merge
/// operator sums them), and a key whose count came back to 0 reads as absent. Readers take a
/// `TallyView`, which sees the counts as they were when it was taken while writes go on.
pub struct Tally {
    db: Arc<ScratchDb>,
}

/// Adds the counts written for a key (8 bytes, little-endian) to what it held.
fn sum_counts(_key: &[u8], held: Option<&[u8]>, added: &MergeOperands) -> Option<Vec<u8>> {
    let mut sum = held.map_or(0, count_of);
    for operand in added {
        sum = sum.wrapping_add(count_of(operand));
    }
    Some(sum.to_le_bytes().to_vec())
}

fn count_of(v: &[u8]) -> i64 {
    v.try_into().map_or(0, i64::from_le_bytes)
}

fn read_count(v: &[u8]) -> Result<i64> {
    let bytes: [u8; 8] = v
        .try_into()
        .map_err(|_| Error::new(ErrorKind::DataCorruption, "bad count in a scratch store"))?;
    Ok(i64::from_le_bytes(bytes))
}

impl Tally {
    /// Creates an empty tally in `dir`, which must not exist.
    pub fn create(dir: &Path) -> Result<Tally> {
        let db = ScratchDb::create(dir, |opts| {
            opts.set_merge_operator_associative("weir.sum", sum_counts)
        })?;
        Ok(Tally { db: Arc::new(db) })
    }

    /// Adds each count to its key's.
    pub fn add<'a>(&self, counts: impl IntoIterator<Item = (&'a [u8], i64)>) -> Result<()> {
        let mut batch = WriteBatch::default();
        for (key, count) in counts {
            batch.merge(key, count.to_le_bytes());
        }
        self.db.write(batch)
    }

    /// The count of `key` now (0 for none).
    pub fn get(&self, key: &[u8]) -> Result<i64> {
        let value = self.db.db().get_pinned(key).map_err(storage_error)?;
        value.map_or(Ok(0), |v| read_count(&v))
    }

    /// The counts as they are now, for as long as the view lives, of the keys under `prefix`
    /// (which the view's keys are read without).
    pub fn view(&self, prefix: &[u8]) -> TallyView {
        let inner = self.db.db().snapshot();
        // SAFETY: the snapshot borrows the database, which `db` keeps alive for as long as
        // the view exists; fields drop in declaration order, so `inner` is released first.
        let inner: rocksdb::Snapshot<'static> = unsafe { std::mem::transmute(inner) };
        TallyView {
            inner,
            db: self.db.clone(),
            prefix: prefix.to_vec(),
        }
    }

    /// The bytes the tally's files take on disk (counts still in its memtable are not there
    /// yet).
    pub fn disk_bytes(&self) -> u64 {
        self.db.disk_bytes()
    }
}

/// A tally's counts under a prefix as they were when the view was taken.
pub struct TallyView {
    // Field order matters: the snapshot must be released before the database it borrows.
    inner: rocksdb::Snapshot<'static>,
    db: Arc<ScratchDb>,
    prefix: Vec<u8>,
}

impl TallyView {
    /// The count of `key` (0 for none).
    pub fn get(&self, key: &[u8]) -> Result<i64> {
        let mut opts = ReadOptions::default();
        opts.set_snapshot(&self.inner);
        let full = [self.prefix.as_slice(), key].concat();
        let value = self
            .db
            .db()
            .get_pinned_opt(&full, &opts)
            .map_err(storage_error)?;
        value.map_or(Ok(0), |v| read_count(&v))
    }

    /// Visits the keys that start with `prefix` and do not count 0, from the first at or
    /// after `start`, in key order, until `visit` returns false.
    pub fn scan_from(
        &self,
        prefix: &[u8],
        start: Option<&[u8]>,
        visit: &mut dyn FnMut(&[u8], i64) -> Result<bool>,
    ) -> Result<()> {
        let within = [self.prefix.as_slice(), prefix].concat();
        let start = start.map(|s| [self.prefix.as_slice(), s].concat());
        let skip = self.prefix.len();
        let mut failure = None;
        scan_db(
            self.db.db(),
            Some(&self.inner),
            &within,
            start.as_deref(),
            false,
            &mut |k, v| match read_count(v) {
                Ok(0) => true,
                Ok(count) => match visit(&k[skip..], count) {
                    Ok(go_on) => go_on,
                    Err(e) => {
                        failure = Some(e);
                        false
                    }
                },
                Err(e) => {
                    failure = Some(e);
                    false
                }
            },
        )?;
        failure.map_or(Ok(()), Err)
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

    #[test]
    fn a_tally_sums_counts_and_a_view_keeps_what_it_saw() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.tally");
        let t = Tally::create(&path).unwrap();
        t.add([
            (b"ra".as_slice(), 2),
            (b"rb".as_slice(), 1),
            (b"ka".as_slice(), 5),
        ])
        .unwrap();
        t.add([(b"ra".as_slice(), -1), (b"rb".as_slice(), -1)])
            .unwrap();
        let view = t.view(b"r");
        t.add([(b"ra".as_slice(), 10), (b"rc".as_slice(), 3)])
            .unwrap();
        assert_eq!((t.get(b"ra").unwrap(), t.get(b"rb").unwrap()), (11, 0));
        // The view: "rb" came back to 0 and is skipped; later counts are not seen.
        assert_eq!((view.get(b"a").unwrap(), view.get(b"c").unwrap()), (1, 0));
        let mut seen = Vec::new();
        view.scan_from(b"", None, &mut |k, c| {
            seen.push((k.to_vec(), c));
            Ok(true)
        })
        .unwrap();
        assert_eq!(seen, vec![(b"a".to_vec(), 1)]);
        let now = t.view(b"r");
        let mut seen = Vec::new();
        now.scan_from(b"", Some(b"b"), &mut |k, c| {
            seen.push((k.to_vec(), c));
            Ok(true)
        })
        .unwrap();
        assert_eq!(seen, vec![(b"c".to_vec(), 3)]);
        // The directory goes with the last of the tally and its views.
        drop(t);
        assert!(path.exists());
        drop((view, now));
        assert!(!path.exists());
    }
}
