//! Commit files: how a transaction block that wrote several tables commits atomically.
//!
//! Before any of the block's records goes into a table's log, all of them are written to one
//! file, `commits/<sequence>.commit` in the tables' directory, which is synced and then given
//! its name (and the directory synced): that rename is the commit point. Only then is each
//! record appended to its table's log, at the record number the file names for it (the
//! committer holds every table's writer, so the numbers are the logs' next ones), and the
//! file is removed. A crash before the rename leaves no record anywhere; after it,
//! `redo` (at the next start, before any table opens) appends each record its log does not
//! hold yet, so the block is in every log or in none. See `docs/design/0010-transactions.md`.
//!
//! A file is `[table id: u32 LE][record number: u64 LE][record]` per table, where a record is
//! laid out as in a change log. A block that ran DDL puts its catalog changes first, as a
//! part for table `u32::MAX`: `[u32::MAX][block number: u64 LE][count: u32 LE][dropped object
//! id: u32 LE]*`; a start applies them to the catalog (`Catalog::settle_blocks`) before the
//! records go into their logs.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, ErrorKind, Result};
use crate::stream::StreamChunk;

use super::{encode_record, ChangeLog, HEADER_BYTES};

/// The directory of commit files, inside the tables' directory.
const COMMITS_DIR: &str = "commits";

/// One table's part of a commit: its id, the record number the record takes in its log, and
/// the record.
pub type Part<'a> = (u32, u64, &'a StreamChunk);

/// What a block changed in the catalog, in its commit file: its number (the objects it created
/// carry it) and the objects it dropped.
pub type CatalogPart<'a> = (u64, &'a [u32]);

/// The table id that marks a commit file's catalog part.
const CATALOG_PART: u32 = u32::MAX;

/// A commit file written and named: the block is committed. Removed once every record is in
/// its log (and its catalog changes are saved).
pub struct Committed {
    path: PathBuf,
}

impl Committed {
    /// Writes the commit file of the block numbered `sequence`, syncs it and names it: the
    /// commit point. Blocking: call off the async workers.
    pub fn write(
        tables_dir: &Path,
        sequence: u64,
        catalog: Option<CatalogPart>,
        parts: &[Part],
    ) -> Result<Committed> {
        let dir = tables_dir.join(COMMITS_DIR);
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{sequence}.commit"));
        let tmp = path.with_extension("tmp");
        let mut bytes = Vec::new();
        if let Some((block, dropped)) = catalog {
            bytes.extend_from_slice(&CATALOG_PART.to_le_bytes());
            bytes.extend_from_slice(&block.to_le_bytes());
            bytes.extend_from_slice(&(dropped.len() as u32).to_le_bytes());
            for id in dropped {
                bytes.extend_from_slice(&id.to_le_bytes());
            }
        }
        for (table, record, chunk) in parts {
            bytes.extend_from_slice(&table.to_le_bytes());
            bytes.extend_from_slice(&record.to_le_bytes());
            bytes.extend(encode_record(chunk, false)?);
        }
        let written = (|| -> std::io::Result<()> {
            crate::failpoint::io("changelog.commit")?;
            let mut f = OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .open(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_data()?;
            drop(f);
            std::fs::rename(&tmp, &path)?;
            File::open(&dir)?.sync_all()
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            // Renamed but not known durable: the block may yet be redone at a restart, so
            // it cannot be reported as not having happened either way.
            if path.exists() {
                return Err(Error::new(
                    ErrorKind::TransactionResolutionUnknown,
                    format!("the commit of a transaction block is in doubt: {e}"),
                )
                .with_hint("Restart the server: it applies the block at start if it committed."));
            }
            return Err(Error::io(
                &e,
                format!("could not write a transaction block's commit file: {e}"),
            ));
        }
        Ok(Committed { path })
    }

    /// Every record is in its log (appended and synced): the file is no longer needed.
    pub fn done(self) {
        // A file left behind is redone harmlessly: its records are in their logs.
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove a commit file");
        }
    }
}

/// The named commit files, oldest first (and any half-written one removed: its block never
/// committed).
fn named_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<(u64, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        match name.strip_suffix(".commit").map(str::parse::<u64>) {
            Some(Ok(sequence)) => files.push((sequence, path)),
            _ => std::fs::remove_file(&path)?,
        }
    }
    files.sort();
    Ok(files.into_iter().map(|(_, p)| p).collect())
}

/// The catalog changes of the committed blocks whose commit files remain: each block's number
/// with the objects it dropped.
pub fn committed_blocks(tables_dir: &Path) -> Result<BTreeMap<u64, Vec<u32>>> {
    let dir = tables_dir.join(COMMITS_DIR);
    let mut blocks = BTreeMap::new();
    if !dir.exists() {
        return Ok(blocks);
    }
    for path in named_files(&dir)? {
        if let (Some((block, dropped)), _) = parts(&std::fs::read(&path)?, &path)? {
            blocks.insert(block, dropped);
        }
    }
    Ok(blocks)
}

/// Appends to each table's log the records of committed blocks it does not hold yet, then
/// removes the commit files (and any half-written one). `live` tells which table ids are in
/// the catalog: a part for any other table (dropped since) is skipped.
pub fn redo(tables_dir: &Path, live: impl Fn(u32) -> bool) -> Result<()> {
    let dir = tables_dir.join(COMMITS_DIR);
    if !dir.exists() {
        return Ok(());
    }
    let files = named_files(&dir)?;
    for path in &files {
        let bytes = std::fs::read(path)?;
        for (table, record, chunk) in parts(&bytes, path)?.1 {
            if !live(table) {
                continue;
            }
            let mut log = ChangeLog::open(tables_dir, table)?;
            let next = log.next_record();
            if record < next {
                continue; // appended before the crash
            }
            if record > next {
                return Err(Error::new(
                    ErrorKind::DataCorruption,
                    format!(
                        "commit file {} puts a record at {record} in the log of table {table}, \
                         which ends at {next}",
                        path.display()
                    ),
                ));
            }
            log.append(&chunk)?;
            tracing::info!(
                table,
                record,
                "redid a committed transaction block's record"
            );
        }
    }
    for path in files {
        std::fs::remove_file(path)?;
    }
    File::open(&dir)?.sync_all()?;
    Ok(())
}

/// A commit file's catalog part, if it has one, and its tables' parts.
type Decoded = (Option<(u64, Vec<u32>)>, Vec<(u32, u64, StreamChunk)>);

/// Decodes a commit file's parts.
fn parts(bytes: &[u8], path: &Path) -> Result<Decoded> {
    let corrupt = || {
        Error::new(
            ErrorKind::DataCorruption,
            format!("commit file {} is damaged", path.display()),
        )
    };
    let mut out = Vec::new();
    let mut rest = bytes;
    let mut catalog = None;
    if rest.len() >= 16 && rest[..4] == CATALOG_PART.to_le_bytes() {
        let block = u64::from_le_bytes(rest[4..12].try_into().map_err(|_| corrupt())?);
        let count = u32::from_le_bytes(rest[12..16].try_into().map_err(|_| corrupt())?) as usize;
        let end = count
            .checked_mul(4)
            .and_then(|n| n.checked_add(16))
            .filter(|end| *end <= rest.len())
            .ok_or_else(corrupt)?;
        let dropped = rest[16..end]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        catalog = Some((block, dropped));
        rest = &rest[end..];
    }
    while !rest.is_empty() {
        if rest.len() < 12 + HEADER_BYTES as usize {
            return Err(corrupt());
        }
        let table = u32::from_le_bytes(rest[..4].try_into().map_err(|_| corrupt())?);
        let record = u64::from_le_bytes(rest[4..12].try_into().map_err(|_| corrupt())?);
        let len = u32::from_le_bytes(rest[12..16].try_into().map_err(|_| corrupt())?) as usize;
        let end = 12 + HEADER_BYTES as usize + len;
        if rest.len() < end {
            return Err(corrupt());
        }
        let mut chunks = ChangeLog::decode_segment(&rest[12..end], &path.display().to_string())?;
        if chunks.len() != 1 {
            return Err(corrupt());
        }
        out.push((table, record, chunks.remove(0)));
        rest = &rest[end..];
    }
    Ok((catalog, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::test_util::chunk;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    /// Every record of table `id`'s log.
    fn records(dir: &std::path::Path, id: u32) -> Vec<StreamChunk> {
        let log = ChangeLog::open(dir, id).unwrap();
        let records = log.records_from(0).unwrap();
        records.map(|r| r.unwrap().1).collect()
    }

    #[test]
    fn a_commit_is_redone_into_the_logs_that_miss_it_and_only_those() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, true)]));
        let mut a = ChangeLog::open(dir.path(), 1).unwrap();
        let b = ChangeLog::open(dir.path(), 2).unwrap();
        a.append(&chunk(&schema, "+ 1")).unwrap();
        let (one, two) = (chunk(&schema, "+ 10"), chunk(&schema, "+ 20\n- 1"));
        let parts = [(1, 1, &one), (2, 0, &two), (3, 0, &two)];
        let committed = Committed::write(dir.path(), 7, None, &parts).unwrap();
        // The crash came after table 1's append, before table 2's.
        a.append(&one).unwrap();
        drop((a, b, committed));
        // A half-written file of another block, never named.
        std::fs::write(dir.path().join(COMMITS_DIR).join("8.tmp"), b"junk").unwrap();
        redo(dir.path(), |t| t != 3).unwrap();
        let (a, b) = (records(dir.path(), 1), records(dir.path(), 2));
        assert_eq!(a.len(), 2);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].ops.len(), 2);
        assert!(!dir.path().join("3.log").exists());
        assert_eq!(
            std::fs::read_dir(dir.path().join(COMMITS_DIR))
                .unwrap()
                .count(),
            0
        );
        // Its catalog part is read before the records are redone, and goes with the file.
        assert!(committed_blocks(dir.path()).unwrap().is_empty());
        let ddl = chunk(&schema, "+ 30");
        let committed =
            Committed::write(dir.path(), 9, Some((4, &[1000, 1001])), &[(2, 1, &ddl)]).unwrap();
        drop(committed);
        assert_eq!(
            committed_blocks(dir.path()).unwrap(),
            BTreeMap::from([(4, vec![1000, 1001])])
        );
        redo(dir.path(), |_| true).unwrap();
        assert_eq!(records(dir.path(), 2).len(), 2);
        assert!(committed_blocks(dir.path()).unwrap().is_empty());
        // Redone once: a second start finds nothing to do.
        redo(dir.path(), |_| true).unwrap();
        assert_eq!(records(dir.path(), 2).len(), 2);
    }
}
