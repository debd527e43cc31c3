//! The durable change log behind each table: every acknowledged INSERT/UPDATE/DELETE is a
//! record appended and fsync'd here before the client hears back.
//!
//! A record is `[length: u32 LE][crc32 of payload: u32 LE][payload]`, where the payload is one
//! `StreamChunk` as an Arrow IPC stream (the ops in an extra column). A torn record at the
//! tail (a crash during an append) is cut off when the log is opened; a bad checksum anywhere
//! else, or a length that runs past the end with a whole record after it, is data corruption.
//!
//! A statement too large for one record is a *group* of records (format 2): each but the last
//! has `MORE` set in its length field, and the last one's sync is the statement's commit
//! point. A group the log ends in the middle of (a crash while it was appended) is cut off
//! whole when the log is opened, as a torn record is.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;

use crate::error::{Error, ErrorKind, Result};
use crate::stream::StreamChunk;

mod commits;
mod spool;
mod temp;

pub use self::commits::{committed_blocks, redo, CatalogPart, Committed};
pub use self::spool::{Gather, PartSize, Rows, Spool};
pub use self::temp::{Reserved, Spills, TempDisk};

/// The encoding of a log's records, as the catalog records it (`catalog::Catalog`): a reader
/// refuses a data directory whose logs may hold a newer one. A change to the record layout
/// or to the payload's encoding bumps it, and the reader goes on reading the earlier ones.
/// Format 2 added groups (`MORE`); format 1 logs are read as logs of one-record groups.
pub const FORMAT: u32 = 2;

/// Upper bound on one record, so that a corrupt length cannot make the reader allocate wildly.
pub const RECORD_BYTES_MAX: u32 = 256 * 1024 * 1024;

const HEADER_BYTES: u64 = 8;

/// Set in a record's length field when more records of the same statement follow it.
const MORE: u32 = 1 << 31;

/// An open table log, positioned at its end.
pub struct ChangeLog {
    dir: PathBuf,
    id: u32,
    path: PathBuf,
    file: File,
    /// The record number of the file's first record: records below it were truncated away
    /// (everything before the oldest retained checkpoint).
    base: u64,
    /// Byte position of each record the file holds, so that truncation knows where to cut.
    starts: Vec<u64>,
    /// Byte offset of the end of the last whole record: the position of the next append.
    end: u64,
    /// A failed write left bytes after `end` that cutting back could not remove (or the cut
    /// is not yet synced): nothing is appended until it is.
    torn: bool,
    /// The directory entry of the file (renamed by a truncation) may not be on disk yet:
    /// nothing is acknowledged until it is.
    unsynced_dir: bool,
}

/// The file of table `id`'s log whose first record is record `base`: `<id>.log` for a log
/// that was never truncated, `<id>.<base>.log` after.
fn file_name(id: u32, base: u64) -> String {
    match base {
        0 => format!("{id}.log"),
        _ => format!("{id}.{base}.log"),
    }
}

/// The bases of the log files of table `id` in `dir`, in increasing order.
fn bases(dir: &Path, id: u32) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    let prefix = format!("{id}.");
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let Some(rest) = name
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix("log"))
        else {
            continue;
        };
        match rest {
            "" => out.push(0),
            _ => {
                if let Some(base) = rest.strip_suffix('.').and_then(|b| b.parse().ok()) {
                    out.push(base);
                }
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

impl ChangeLog {
    /// Opens (or creates, empty from record 0) table `id`'s log in `dir`, every record read
    /// and checked (one at a time), a torn tail cut off. Of several files (a crash during a
    /// truncation), the one with the highest base is the log: it was complete before it got
    /// its name.
    pub fn open(dir: &Path, id: u32) -> Result<ChangeLog> {
        let mut all = bases(dir, id)?;
        let base = all.pop().unwrap_or(0);
        for stale in all {
            std::fs::remove_file(dir.join(file_name(id, stale)))?;
        }
        ChangeLog::open_file(dir, id, base)
    }

    /// The records from record `from` (or the base, if above) to the end, read one at a time
    /// as they are taken, each with its number.
    pub fn records_from(&self, from: u64) -> Result<Records> {
        let first = from.clamp(self.base, self.next_record());
        let positions = self.starts[(first - self.base) as usize..].to_vec();
        Ok(Records {
            file: std::io::BufReader::with_capacity(1 << 20, File::open(&self.path)?),
            path: self.path.clone(),
            positions: positions.into_iter(),
            next: first,
        })
    }

    /// Creates table `id`'s log in `dir` empty, starting at record `base` (a table restored
    /// from a checkpoint without its log), replacing any file of it.
    pub fn create_at(dir: &Path, id: u32, base: u64) -> Result<ChangeLog> {
        ChangeLog::remove(dir, id)?;
        let log = ChangeLog::open_file(dir, id, base)?;
        std::fs::File::open(dir)?.sync_all()?;
        Ok(log)
    }

    /// The tables in `dir` whose logs were truncated, with the record each now starts at.
    pub fn truncated(dir: &Path) -> Result<Vec<(u32, u64)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            let mut parts = name.split('.');
            if let (Some(id), Some(base), Some("log"), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            {
                if let (Ok(id), Ok(base)) = (id.parse(), base.parse()) {
                    out.push((id, base));
                }
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Deletes every file of table `id`'s log.
    pub fn remove(dir: &Path, id: u32) -> Result<()> {
        for base in bases(dir, id)? {
            std::fs::remove_file(dir.join(file_name(id, base)))?;
        }
        Ok(())
    }

    fn open_file(dir: &Path, id: u32, base: u64) -> Result<ChangeLog> {
        let path = dir.join(file_name(id, base));
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(0))?;
        let reader = std::io::BufReader::with_capacity(1 << 20, &mut file);
        let (_, starts, end) = read_records(reader, len, &path, false)?;
        if end < len {
            tracing::warn!(
                path = %path.display(),
                torn_bytes = len - end,
                "cutting off a torn record (or a group's records) at the end of the change log"
            );
            file.set_len(end)?;
            file.sync_all()?;
        }
        Ok(ChangeLog {
            dir: dir.to_path_buf(),
            id,
            path,
            file,
            base,
            starts,
            end,
            torn: false,
            unsynced_dir: false,
        })
    }

    /// The record number of the first record the log holds.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The number of the next record appended.
    pub fn next_record(&self) -> u64 {
        self.base + self.starts.len() as u64
    }

    /// The records from record `from` (or the base, if above) to the end, as the file holds
    /// them; with the numbers of the first and of the next record.
    pub fn raw_from(&mut self, from: u64) -> Result<(u64, u64, Vec<u8>)> {
        let first = from.clamp(self.base, self.next_record());
        let start = self
            .starts
            .get((first - self.base) as usize)
            .copied()
            .unwrap_or(self.end);
        let mut bytes = vec![0u8; (self.end - start) as usize];
        self.file.seek(SeekFrom::Start(start))?;
        self.file.read_exact(&mut bytes)?;
        Ok((first, self.next_record(), bytes))
    }

    /// Decodes a shipped segment: whole records only.
    pub fn decode_segment(bytes: &[u8], name: &str) -> Result<Vec<StreamChunk>> {
        let (chunks, _, end) = read_records(bytes, bytes.len() as u64, Path::new(name), true)?;
        if end != bytes.len() as u64 {
            return Err(Error::new(
                ErrorKind::DataCorruption,
                format!("log segment {name} ends in the middle of a record"),
            ));
        }
        Ok(chunks)
    }

    /// Appends records and waits until they are on disk (once for all).
    pub fn append_all(&mut self, chunks: &[StreamChunk]) -> Result<()> {
        let mut bytes = Vec::new();
        let mut starts = Vec::new();
        for chunk in chunks {
            starts.push(self.end + bytes.len() as u64);
            bytes.extend(encode_record(chunk, false)?);
        }
        self.write_synced(&bytes)?;
        self.starts.extend(starts);
        self.end += bytes.len() as u64;
        Ok(())
    }

    /// Appends one statement's changes as a group of records, `parts` in order (each a
    /// record), and waits until they are on disk: each record is synced before the next is
    /// written, so the last one's sync commits the whole group. On any failure (of a part or of
    /// a write) nothing of the group stays in the log. Returns the number of the first record.
    pub fn append_group(
        &mut self,
        parts: &mut dyn Iterator<Item = Result<StreamChunk>>,
    ) -> Result<u64> {
        let first = self.next_record();
        let mut parts = parts.peekable();
        let mut starts = Vec::new();
        let mut written = 0u64;
        let appended = (|| {
            while let Some(part) = parts.next() {
                let more = parts.peek().is_some();
                let record = encode_record(&part?, more)?;
                starts.push(self.end + written);
                self.write_synced(&record)?;
                written += record.len() as u64;
                if more {
                    // A crash here leaves a group the log ends in the middle of.
                    crate::failpoint::hit("changelog.group_part");
                }
            }
            Ok(())
        })();
        if let Err(e) = appended {
            if written > 0 {
                // The group's records so far come off with it.
                self.torn = true;
                let _ = self.cut_back();
            }
            return Err(e);
        }
        self.starts.extend(starts);
        self.end += written;
        Ok(first)
    }

    /// Drops the records below record `offset` (no longer needed by any retained
    /// checkpoint): the rest is copied into a new file, synced, and given its name, and only
    /// then is the old file deleted. A no-op when `offset` is not above the base.
    pub fn truncate_below(&mut self, offset: u64) -> Result<()> {
        let offset = offset.min(self.next_record());
        if offset <= self.base || self.torn {
            return Ok(());
        }
        let first = (offset - self.base) as usize;
        let from = self.starts.get(first).copied().unwrap_or(self.end);
        let rest = self.end - from;
        let path = self.dir.join(file_name(self.id, offset));
        let tmp = path.with_extension("log.tmp");
        // Written, synced and opened for appends before it gets its name: a failure up to the
        // rename (a full disk, no descriptor left) leaves the old file the log.
        let written = (|| -> std::io::Result<File> {
            crate::failpoint::io("changelog.truncate")?;
            let mut f = OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(&tmp)?;
            // Copied through a small buffer: the records kept can be larger than memory.
            let mut old = &self.file;
            old.seek(SeekFrom::Start(from))?;
            let copied = std::io::copy(&mut old.take(rest), &mut f)?;
            if copied != rest {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("the log ended {} bytes early", rest - copied),
                ));
            }
            f.sync_all()?;
            drop(f);
            let f = OpenOptions::new().read(true).append(true).open(&tmp)?;
            std::fs::rename(&tmp, &path)?;
            Ok(f)
        })();
        let file = match written {
            Ok(f) => f,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(Error::io(
                    &e,
                    format!("could not truncate change log {}: {e}", self.path.display()),
                ));
            }
        };
        // Renamed, the new file is the log (the next open takes the higher base).
        let old = std::mem::replace(&mut self.path, path);
        self.file = file;
        self.starts = self.starts[first..].iter().map(|s| s - from).collect();
        self.end -= from;
        self.base = offset;
        self.unsynced_dir = true;
        self.sync_dir()?;
        // Both files exist: the next open takes the new one.
        crate::failpoint::hit("table.log_truncated");
        std::fs::remove_file(old)?;
        Ok(())
    }

    /// Makes the log file's directory entry durable.
    fn sync_dir(&mut self) -> Result<()> {
        if self.unsynced_dir {
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| {
                    Error::io(
                        &e,
                        format!("could not sync directory {}: {e}", self.dir.display()),
                    )
                })?;
            self.unsynced_dir = false;
        }
        Ok(())
    }

    /// Cuts the file back to its last whole record after a failed write, and syncs the cut.
    fn cut_back(&mut self) -> Result<()> {
        let (file, end) = (&self.file, self.end);
        crate::blocking(|| {
            crate::failpoint::io("changelog.cut_back")?;
            file.set_len(end)?;
            file.sync_all()
        })
        .map_err(|e| {
            Error::io(
                &e,
                format!(
                    "could not cut change log {} back to its last whole record: {e}",
                    self.path.display()
                ),
            )
        })?;
        self.torn = false;
        Ok(())
    }

    /// Writes `bytes` (whole records) at the end of the file and waits until they are on disk,
    /// off the async workers; on failure the file is cut back to its end, leaving no
    /// half-written record behind that a later append would follow.
    /// A write that failed once is retried by the next statement's append (the disk may have
    /// space again), after the cut-back and the directory sync that failed with it.
    fn write_synced(&mut self, bytes: &[u8]) -> Result<()> {
        if self.torn {
            self.cut_back()?;
        }
        self.sync_dir()?;
        let file = &mut self.file;
        let written = crate::blocking(|| {
            crate::failpoint::io("changelog.write")?;
            file.write_all(bytes)?;
            crate::failpoint::stall("changelog.sync");
            crate::failpoint::io("changelog.sync")?;
            file.sync_data()
        });
        if let Err(e) = written {
            self.torn = true;
            let _ = self.cut_back();
            return Err(Error::io(
                &e,
                format!("could not write change log {}: {e}", self.path.display()),
            ));
        }
        Ok(())
    }

    /// Appends one chunk and waits until it is on disk. Returns the offset after the record.
    pub fn append(&mut self, chunk: &StreamChunk) -> Result<u64> {
        let record = encode_record(chunk, false)?;
        self.write_synced(&record)?;
        self.starts.push(self.end);
        self.end += record.len() as u64;
        Ok(self.end)
    }

    pub fn end(&self) -> u64 {
        self.end
    }
}

/// A log's records from some record on, read from the file one at a time
/// (`ChangeLog::records_from`).
pub struct Records {
    file: std::io::BufReader<File>,
    path: PathBuf,
    positions: std::vec::IntoIter<u64>,
    next: u64,
}

impl Records {
    /// How many records are left.
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read(&mut self, pos: u64) -> Result<StreamChunk> {
        self.file.seek(SeekFrom::Start(pos))?;
        let mut header = [0u8; HEADER_BYTES as usize];
        self.file.read_exact(&mut header)?;
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) & !MORE;
        let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        let corrupt = |what: &str| {
            Error::new(
                ErrorKind::DataCorruption,
                format!(
                    "{what} in change log {} at offset {pos}",
                    self.path.display()
                ),
            )
        };
        if len > RECORD_BYTES_MAX {
            return Err(corrupt("a record too long"));
        }
        let mut payload = vec![0u8; len as usize];
        self.file.read_exact(&mut payload)?;
        if crc32fast::hash(&payload) != crc {
            return Err(corrupt("checksum mismatch"));
        }
        decode_payload(&payload, &self.path, pos)
    }
}

impl Iterator for Records {
    type Item = Result<(u64, StreamChunk)>;

    fn next(&mut self) -> Option<Self::Item> {
        let pos = self.positions.next()?;
        let record = self.next;
        self.next += 1;
        Some(crate::blocking(|| self.read(pos)).map(|chunk| (record, chunk)))
    }
}

/// The chunk a record's checked payload holds (the record at byte `pos` of `path`).
fn decode_payload(payload: &[u8], path: &Path, pos: u64) -> Result<StreamChunk> {
    let batch = StreamReader::try_new(payload, None)?
        .next()
        .ok_or_else(|| {
            Error::new(
                ErrorKind::DataCorruption,
                format!(
                    "an empty record in change log {} at offset {pos}",
                    path.display()
                ),
            )
        })??;
    StreamChunk::from_batch_with_ops(batch)
}

/// One record holding `chunk`; `more` when further records of its group follow it.
fn encode_record(chunk: &StreamChunk, more: bool) -> Result<Vec<u8>> {
    let batch = chunk.to_batch_with_ops()?;
    let mut payload = Vec::new();
    {
        let mut w = StreamWriter::try_new(&mut payload, &batch.schema())?;
        w.write(&batch)?;
        w.finish()?;
    }
    if payload.len() as u64 > RECORD_BYTES_MAX as u64 {
        return Err(Error::new(
            ErrorKind::ProgramLimitExceeded,
            format!(
                "a single statement's changes exceed {} bytes",
                RECORD_BYTES_MAX
            ),
        ));
    }
    let mut record = Vec::with_capacity(payload.len() + HEADER_BYTES as usize);
    let length = payload.len() as u32 | if more { MORE } else { 0 };
    record.extend_from_slice(&length.to_le_bytes());
    record.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    record.extend_from_slice(&payload);
    Ok(record)
}

/// Reads the `len` bytes of a log from its start, a record at a time, each checked: returns
/// the records (decoded only with `decode`), the byte position of every record, and the end
/// of the last whole one. One record's bytes are in memory at a time (and the rest of the
/// file, when a damaged length must be told from a torn tail).
fn read_records(
    mut reader: impl Read,
    len: u64,
    path: &Path,
    decode: bool,
) -> Result<(Vec<StreamChunk>, Vec<u64>, u64)> {
    let (mut chunks, mut starts) = (Vec::new(), Vec::new());
    let mut payload = Vec::new();
    let mut pos = 0u64;
    // Where the group being read began (its byte position, and how many records and chunks
    // came before it), while its last record has not been read.
    let mut group: Option<(u64, usize, usize)> = None;
    while len - pos >= HEADER_BYTES {
        let mut header = [0u8; HEADER_BYTES as usize];
        reader.read_exact(&mut header)?;
        let field = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
        let (record_len, more) = (field & !MORE, field & MORE != 0);
        let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        let end = pos + HEADER_BYTES + record_len as u64;
        if record_len > RECORD_BYTES_MAX || end > len {
            // A record that runs past the end of the file is a torn append, unless a whole
            // record follows it: then its length field is damaged, and taking it for a torn
            // tail would drop every record after it.
            let mut rest = header.to_vec();
            reader.read_to_end(&mut rest)?;
            if let Some(next) = whole_record_after(&rest, 0) {
                return Err(Error::new(
                    ErrorKind::DataCorruption,
                    format!(
                        "change log {} is damaged: record {} (at byte {pos}) has a length \
                         of {record_len} bytes, yet a whole record starts at byte {}",
                        path.display(),
                        starts.len(),
                        pos + next as u64,
                    ),
                ));
            }
            break;
        }
        payload.resize(record_len as usize, 0);
        reader.read_exact(&mut payload)?;
        if crc32fast::hash(&payload) != crc {
            if end == len {
                // The last record's bytes were not all written: torn.
                break;
            }
            return Err(Error::new(
                ErrorKind::DataCorruption,
                format!(
                    "checksum mismatch in change log {} at offset {pos}",
                    path.display()
                ),
            ));
        }
        let kept = chunks.len();
        if decode {
            chunks.push(decode_payload(&payload, path, pos)?);
        }
        if more && group.is_none() {
            group = Some((pos, starts.len(), kept));
        } else if !more {
            group = None;
        }
        starts.push(pos);
        pos = end;
    }
    // A group the log ends in (or tears) in the middle of was never committed: it goes whole.
    if let Some((at, records, kept)) = group {
        starts.truncate(records);
        chunks.truncate(kept);
        pos = at;
    }
    Ok((chunks, starts, pos))
}

/// The start of the first whole record (header, checksum and an Arrow IPC payload) after
/// byte `pos`, if any. Only positions whose payload would begin as an IPC stream does (its
/// continuation marker) are tried, so the search reads the bytes about once; a torn append's
/// bytes hold no whole record but by a checksum collision (one in 2^32 per position tried).
fn whole_record_after(bytes: &[u8], pos: usize) -> Option<usize> {
    const MARKER: [u8; 4] = [0xff; 4];
    let header = HEADER_BYTES as usize;
    (pos + 1..bytes.len().saturating_sub(header + MARKER.len() - 1)).find(|&p| {
        if bytes[p + header..p + header + MARKER.len()] != MARKER {
            return false;
        }
        let len = u32::from_le_bytes([bytes[p], bytes[p + 1], bytes[p + 2], bytes[p + 3]]) & !MORE;
        let crc = u32::from_le_bytes([bytes[p + 4], bytes[p + 5], bytes[p + 6], bytes[p + 7]]);
        let end = (p + header).saturating_add(len as usize);
        len <= RECORD_BYTES_MAX
            && end <= bytes.len()
            && crc32fast::hash(&bytes[p + header..end]) == crc
            && StreamReader::try_new(&bytes[p + header..end], None)
                .ok()
                .and_then(|mut r| r.next())
                .is_some_and(|b| b.is_ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::test_util::{chunk, schema};
    use datafusion::arrow::datatypes::DataType;

    /// Opens a log and reads its records from record `from` on.
    fn open(dir: &Path, id: u32, from: u64) -> Result<(ChangeLog, Vec<StreamChunk>)> {
        let log = ChangeLog::open(dir, id)?;
        let records = log.records_from(from)?;
        let chunks = records.map(|r| r.map(|(_, c)| c)).collect::<Result<_>>()?;
        Ok((log, chunks))
    }

    #[test]
    fn records_survive_reopen_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("7.log");
        let s = schema(&[("a", DataType::Int64), ("b", DataType::Utf8)]);
        {
            let (mut log, old) = open(dir.path(), 7, 0).unwrap();
            assert!(old.is_empty());
            log.append(&chunk(&s, "+ 1 x\n+ 2 y")).unwrap();
            log.append(&chunk(&s, "- 1 x")).unwrap();
        }
        // Simulate a crash in the middle of a third append.
        let whole = std::fs::metadata(&path).unwrap().len();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[200, 0, 0, 0, 1, 2, 3]).unwrap();
        drop(f);
        let (log, chunks) = open(dir.path(), 7, 0).unwrap();
        assert_eq!(log.end(), whole);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);
        let text: Vec<String> = chunks.iter().map(|c| c.to_string()).collect();
        assert_eq!(text, ["+ 1 x\n+ 2 y\n", "- 1 x\n"]);
    }

    #[test]
    fn corruption_in_the_middle_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("7.log");
        let s = schema(&[("a", DataType::Int64)]);
        {
            let (mut log, _) = open(dir.path(), 7, 0).unwrap();
            log.append(&chunk(&s, "+ 1")).unwrap();
            log.append(&chunk(&s, "+ 2")).unwrap();
        }
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[20] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        let err = open(dir.path(), 7, 0).err().unwrap();
        assert_eq!(err.kind, ErrorKind::DataCorruption);
    }

    #[test]
    fn a_damaged_length_in_the_middle_is_corruption_not_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("7.log");
        let s = schema(&[("a", DataType::Int64)]);
        let second = {
            let (mut log, _) = open(dir.path(), 7, 0).unwrap();
            let first = log.append(&chunk(&s, "+ 1")).unwrap();
            log.append(&chunk(&s, "+ 2")).unwrap();
            log.append(&chunk(&s, "+ 3")).unwrap();
            first as usize
        };
        let whole = std::fs::read(&path).unwrap();
        // The second record's length made larger (past the end) and far too large: either
        // way the third record, acknowledged, follows it.
        for len in [whole.len() as u32, u32::MAX] {
            let mut bytes = whole.clone();
            bytes[second..second + 4].copy_from_slice(&len.to_le_bytes());
            std::fs::write(&path, &bytes).unwrap();
            let err = open(dir.path(), 7, 0).err().unwrap();
            assert_eq!(err.kind, ErrorKind::DataCorruption, "{}", err.message);
            assert!(err.message.contains("record 1 (at byte"), "{}", err.message);
            // Nothing was cut off.
            assert_eq!(std::fs::read(&path).unwrap(), bytes);
        }
        // A torn append of the same bytes (every record after the second lost with it, as a
        // crash mid-write leaves them) is still cut off as before.
        for (cut, kept) in [
            (second + 3, 1),
            (second + 8, 1),
            (second + 12, 1),
            (whole.len() - 1, 2),
        ] {
            std::fs::write(&path, &whole[..cut]).unwrap();
            let (_, chunks) = open(dir.path(), 7, 0).unwrap();
            assert_eq!(chunks.len(), kept, "cut at {cut}");
        }
    }

    #[test]
    fn a_group_is_whole_or_gone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("7.log");
        let s = schema(&[("a", DataType::Int64)]);
        let part = |t: &str| Ok(chunk(&s, t));
        let (mut log, _) = open(dir.path(), 7, 0).unwrap();
        log.append(&chunk(&s, "+ 1")).unwrap();
        let first = log
            .append_group(&mut [part("+ 2"), part("+ 3"), part("+ 4")].into_iter())
            .unwrap();
        assert_eq!((first, log.next_record()), (1, 4));
        let whole = std::fs::read(&path).unwrap();
        {
            let (_, chunks) = open(dir.path(), 7, 0).unwrap();
            assert_eq!(chunks.len(), 4);
            // Opened from the middle of the group, the rest of it is read.
            let (_, rest) = open(dir.path(), 7, 2).unwrap();
            let text: Vec<String> = rest.iter().map(|c| c.to_string()).collect();
            assert_eq!(text, ["+ 3\n", "+ 4\n"]);
        };
        let one = encode_record(&chunk(&s, "+ 1"), false).unwrap().len();
        // A crash after any of the group's records but the last (or in the middle of one):
        // the group goes, the record before it stays.
        for cut in [one + 1, one + 40, whole.len() - 30, whole.len() - 1] {
            std::fs::write(&path, &whole[..cut]).unwrap();
            let (log, chunks) = open(dir.path(), 7, 0).unwrap();
            assert_eq!(
                (chunks.len(), log.next_record(), log.end()),
                (1, 1, one as u64)
            );
            assert_eq!(
                std::fs::metadata(&path).unwrap().len(),
                one as u64,
                "cut at {cut}"
            );
        }
        // A part that fails leaves nothing of its group; the log takes the next append.
        let (mut log, _) = open(dir.path(), 7, 0).unwrap();
        let failed =
            log.append_group(&mut [part("+ 2"), Err(Error::internal("no more rows"))].into_iter());
        assert!(failed.is_err());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), one as u64);
        log.append(&chunk(&s, "+ 5")).unwrap();
        let (_, chunks) = open(dir.path(), 7, 0).unwrap();
        let text: Vec<String> = chunks.iter().map(|c| c.to_string()).collect();
        assert_eq!(text, ["+ 1\n", "+ 5\n"]);
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn truncation_keeps_record_numbers_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let s = schema(&[("a", DataType::Int64)]);
        let (mut log, _) = open(dir.path(), 3, 0).unwrap();
        for i in 0..5 {
            log.append(&chunk(&s, &format!("+ {i}"))).unwrap();
        }
        log.truncate_below(2).unwrap();
        assert_eq!((log.base(), log.next_record()), (2, 5));
        log.append(&chunk(&s, "+ 5")).unwrap();
        log.truncate_below(1).unwrap();
        assert_eq!(log.base(), 2, "never below the base");
        log.truncate_below(4).unwrap();
        log.append(&chunk(&s, "+ 6")).unwrap();
        drop(log);
        assert_eq!(files(dir.path()), ["3.4.log"]);
        let (log, chunks) = open(dir.path(), 3, 0).unwrap();
        assert_eq!((log.base(), log.next_record()), (4, 7));
        let text: Vec<String> = chunks.iter().map(|c| c.to_string()).collect();
        assert_eq!(text, ["+ 4\n", "+ 5\n", "+ 6\n"]);
        // Opened from a record on, only the records from there are returned.
        drop(log);
        let (log, chunks) = open(dir.path(), 3, 6).unwrap();
        assert_eq!((log.base(), log.next_record()), (4, 7));
        let text: Vec<String> = chunks.iter().map(|c| c.to_string()).collect();
        assert_eq!(text, ["+ 6\n"]);
        // A crash during a truncation can leave the old file beside the new one: the new
        // one is the log, the old one goes.
        std::fs::write(dir.path().join("3.log"), b"").unwrap();
        let (log, _) = open(dir.path(), 3, 0).unwrap();
        assert_eq!(log.base(), 4);
        assert_eq!(files(dir.path()), ["3.4.log"]);
        // Another table's files are not this one's.
        let other = ChangeLog::create_at(dir.path(), 31, 9).unwrap();
        assert_eq!((other.base(), other.next_record()), (9, 9));
        assert_eq!(files(dir.path()), ["3.4.log", "31.9.log"]);
        assert_eq!(ChangeLog::truncated(dir.path()).unwrap(), [(3, 4), (31, 9)]);
        ChangeLog::remove(dir.path(), 3).unwrap();
        assert_eq!(files(dir.path()), ["31.9.log"]);
    }
}
