//! The durable change log behind each table: every acknowledged INSERT/UPDATE/DELETE is a
//! record appended and fsync'd here before the client hears back.
//!
//! A record is `[length: u32 LE][crc32 of payload: u32 LE][payload]`, where the payload is one
//! `StreamChunk` as an Arrow IPC stream (the ops in an extra column). A torn record at the
//! tail (a crash during an append) is cut off when the log is opened; a bad checksum anywhere
//! else is data corruption.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;

use crate::error::{Error, ErrorKind, Result};
use crate::stream::chunk::StreamChunk;

/// Upper bound on one record, so that a corrupt length cannot make the reader allocate wildly.
pub const RECORD_BYTES_MAX: u32 = 256 * 1024 * 1024;

const HEADER_BYTES: u64 = 8;

/// An open table log, positioned at its end.
pub struct ChangeLog {
    path: PathBuf,
    file: File,
    /// Byte offset of the end of the last whole record: the position of the next append.
    end: u64,
}

impl ChangeLog {
    /// Opens (or creates) the log at `path` and returns it with every record it holds.
    pub fn open(path: &Path) -> Result<(ChangeLog, Vec<StreamChunk>)> {
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)?;
        let len = file.metadata()?.len();
        let mut bytes = Vec::with_capacity(len as usize);
        file.seek(SeekFrom::Start(0))?;
        file.read_to_end(&mut bytes)?;
        let (chunks, end) = decode_records(&bytes, path)?;
        if end < len {
            tracing::warn!(
                path = %path.display(),
                torn_bytes = len - end,
                "cutting off a torn record at the end of the change log"
            );
            file.set_len(end)?;
            file.sync_all()?;
        }
        Ok((
            ChangeLog {
                path: path.to_path_buf(),
                file,
                end,
            },
            chunks,
        ))
    }

    /// Appends one chunk and waits until it is on disk. Returns the offset after the record.
    pub fn append(&mut self, chunk: &StreamChunk) -> Result<u64> {
        let record = encode_record(chunk)?;
        if let Err(e) = self
            .file
            .write_all(&record)
            .and_then(|_| self.file.sync_data())
        {
            // Leave no half-written record behind that a later append would follow.
            let _ = self.file.set_len(self.end);
            return Err(Error::unavailable(format!(
                "could not write change log {}: {e}",
                self.path.display()
            )));
        }
        self.end += record.len() as u64;
        Ok(self.end)
    }

    pub fn end(&self) -> u64 {
        self.end
    }
}

fn encode_record(chunk: &StreamChunk) -> Result<Vec<u8>> {
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
    record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    record.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    record.extend_from_slice(&payload);
    Ok(record)
}

/// Decodes whole records; returns them and the offset where the whole records end.
fn decode_records(bytes: &[u8], path: &Path) -> Result<(Vec<StreamChunk>, u64)> {
    let mut chunks = Vec::new();
    let mut pos = 0usize;
    while bytes.len() - pos >= HEADER_BYTES as usize {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().expect("4 bytes"));
        let start = pos + HEADER_BYTES as usize;
        let Some(end) = start.checked_add(len as usize) else {
            break;
        };
        if len > RECORD_BYTES_MAX || end > bytes.len() {
            // A record that runs past the end of the file is a torn append.
            break;
        }
        let payload = &bytes[start..end];
        if crc32fast::hash(payload) != crc {
            if end == bytes.len() {
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
        let reader = StreamReader::try_new(payload, None)?;
        for batch in reader {
            chunks.push(StreamChunk::from_batch_with_ops(batch?)?);
        }
        pos = end;
    }
    Ok((chunks, pos as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::chunk::test_util::{chunk, schema};
    use datafusion::arrow::datatypes::DataType;

    #[test]
    fn records_survive_reopen_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.log");
        let s = schema(&[("a", DataType::Int64), ("b", DataType::Utf8)]);
        {
            let (mut log, old) = ChangeLog::open(&path).unwrap();
            assert!(old.is_empty());
            log.append(&chunk(&s, "+ 1 x\n+ 2 y")).unwrap();
            log.append(&chunk(&s, "- 1 x")).unwrap();
        }
        // Simulate a crash in the middle of a third append.
        let whole = std::fs::metadata(&path).unwrap().len();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[200, 0, 0, 0, 1, 2, 3]).unwrap();
        drop(f);
        let (log, chunks) = ChangeLog::open(&path).unwrap();
        assert_eq!(log.end(), whole);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);
        let text: Vec<String> = chunks.iter().map(|c| c.to_string()).collect();
        assert_eq!(text, ["+ 1 x\n+ 2 y\n", "- 1 x\n"]);
    }

    #[test]
    fn corruption_in_the_middle_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.log");
        let s = schema(&[("a", DataType::Int64)]);
        {
            let (mut log, _) = ChangeLog::open(&path).unwrap();
            log.append(&chunk(&s, "+ 1")).unwrap();
            log.append(&chunk(&s, "+ 2")).unwrap();
        }
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[20] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        let err = ChangeLog::open(&path).err().unwrap();
        assert_eq!(err.kind, ErrorKind::DataCorruption);
    }
}
