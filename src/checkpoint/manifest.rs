//! A checkpoint's manifest: the commit point of a checkpoint. Stored as one line of JSON
//! followed by a line `crc32 <hex>` over the JSON's bytes, so that a damaged or truncated
//! manifest is recognised as such, never half read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ledger::FileRef;
use crate::error::{Error, ErrorKind, Result};

/// 2: delta checkpoints (`mode`, `deltas`). Format 1 manifests are base checkpoints and
/// read as such.
/// 3: a table whose actor had failed is recorded at the offset where its state ends (the
/// epochs its actor committed), so a restore replays its log from there; before, its offset
/// was the barrier's and a restore rebuilt it from its whole log.
/// 4: sources' connector positions (`splits`), sinks' handles (`sinks`); a source restored
/// from an earlier format resumes by counting its offset's rows.
pub const FORMAT: u32 = 4;

/// The first format whose failed tables' offsets are where their state ends.
pub const FORMAT_FAILED_TABLES_RESUME: u32 = 3;

/// A base checkpoint is a RocksDB checkpoint; a delta one names its base's files and the
/// deltas written since (`docs/design/0003-checkpoints.md`, "Delta checkpoints").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Base,
    Delta,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Base => "base",
            Mode::Delta => "delta",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Periodic,
    Manual,
    External,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Periodic => "periodic",
            Kind::Manual => "manual",
            Kind::External => "external",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timings {
    /// From the checkpoint barrier's injection until every actor had committed its epoch.
    pub align_ms: u64,
    /// Flushing RocksDB's memtable and linking its files.
    pub snapshot_ms: u64,
    /// Uploading the new files and the manifest.
    pub upload_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub id: u64,
    /// The epoch whose state the checkpoint holds: everything before its barrier.
    pub epoch: u64,
    pub kind: Kind,
    /// A caller's label (external triggers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The server run that took it (the `<run>` in its shared objects' names).
    pub run: String,
    /// Milliseconds since the Unix epoch.
    pub started_at_ms: i64,
    #[serde(default)]
    pub mode: Mode,
    /// Every file of the RocksDB checkpoint: reused and uploaded alike. A delta checkpoint
    /// names its base's.
    pub files: Vec<FileRef>,
    /// The SST files of the writes since the base checkpoint, oldest first: a restore
    /// ingests each over the ones before it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deltas: Vec<FileRef>,
    pub files_uploaded: u64,
    pub bytes_uploaded: u64,
    /// Each table's offset at the epoch, by relation id: the records of its change log fed
    /// into the dataflow before the checkpoint's barrier (replay resumes after them); for a
    /// table whose actor had failed, those its state holds.
    pub offsets: BTreeMap<u32, u64>,
    /// Each table's last watermark value at the epoch (tables with `WATERMARK FOR` that had
    /// sent one): a restored table goes on from it, never back.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub watermarks: BTreeMap<u32, i64>,
    /// Where each source's connector resumes after the rows of its offset, split by split, in
    /// the connector's own terms (a file source: the file and byte it reached), for sources
    /// whose connector keeps a position.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub splits: BTreeMap<u32, BTreeMap<String, serde_json::Value>>,
    /// Actors that had failed when the snapshot was taken: the state of their views stopped
    /// short of the epoch, so a restore rebuilds those views instead. A failed table's state
    /// ends at its offset (from format 3), and a restore replays its log from there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_actors: Vec<u32>,
    /// The catalog at the checkpoint's epoch (read with DDL held off while the barrier was
    /// injected).
    pub catalog: serde_json::Value,
    pub timings: Timings,
}

impl Manifest {
    /// A base checkpoint `id` at epoch `id * 10` naming `files`, with an empty catalog and
    /// nothing else, for tests.
    #[cfg(test)]
    pub(crate) fn for_tests(id: u64, files: Vec<FileRef>) -> Manifest {
        Manifest {
            format: FORMAT,
            id,
            epoch: id * 10,
            kind: Kind::Periodic,
            label: None,
            run: "r".into(),
            started_at_ms: 0,
            mode: Mode::Base,
            files,
            deltas: Vec::new(),
            files_uploaded: 0,
            bytes_uploaded: 0,
            offsets: BTreeMap::new(),
            watermarks: BTreeMap::new(),
            splits: BTreeMap::new(),
            failed_actors: Vec::new(),
            catalog: serde_json::json!({"next_id": 1000, "objects": []}),
            timings: Timings::default(),
        }
    }

    /// Every object the checkpoint names: its base's files, then its deltas.
    pub fn objects(&self) -> impl Iterator<Item = &FileRef> {
        self.files.iter().chain(&self.deltas)
    }

    pub fn bytes_referenced(&self) -> u64 {
        self.objects().map(|f| f.size).sum()
    }

    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut out = serde_json::to_vec(self)
            .map_err(|e| Error::internal(format!("cannot encode a manifest: {e}")))?;
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(format!("\ncrc32 {crc:08x}\n").as_bytes());
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<Manifest> {
        let damaged = |why: &str| {
            Error::new(
                ErrorKind::DataCorruption,
                format!("damaged checkpoint manifest: {why}"),
            )
        };
        let text = std::str::from_utf8(bytes).map_err(|_| damaged("not UTF-8"))?;
        let text = text
            .strip_suffix('\n')
            .ok_or_else(|| damaged("truncated"))?;
        let (json, trailer) = text
            .rsplit_once('\n')
            .ok_or_else(|| damaged("no checksum"))?;
        let crc = trailer
            .strip_prefix("crc32 ")
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .ok_or_else(|| damaged("no checksum"))?;
        if crc32fast::hash(json.as_bytes()) != crc {
            return Err(damaged("checksum mismatch"));
        }
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| damaged(&e.to_string()))?;
        // A newer version's manifest is refused before the rest is read, whatever its shape.
        let format = value.get("format").and_then(|f| f.as_u64()).unwrap_or(0);
        if format > FORMAT as u64 {
            return Err(Error::not_supported(format!(
                "checkpoint manifest of format {format}, newer than this version of Weir \
                 reads (up to {FORMAT})"
            ))
            .with_hint("Start the version of Weir that wrote it, or a newer one."));
        }
        let manifest: Manifest =
            serde_json::from_value(value).map_err(|e| damaged(&e.to_string()))?;
        if manifest.format == 0 {
            return Err(damaged("unknown format 0"));
        }
        Ok(manifest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            format: FORMAT,
            id: 7,
            epoch: 42,
            kind: Kind::Manual,
            label: None,
            run: "00ff".into(),
            started_at_ms: 1,
            mode: Mode::Delta,
            files: vec![FileRef {
                object: "shared/00ff-000009.sst".into(),
                local: "000009.sst".into(),
                size: 1234,
                crc32: 99,
            }],
            deltas: vec![FileRef {
                object: "shared/00ff-delta-00000000000000000008.sst".into(),
                local: "00ff-delta-00000000000000000008.sst".into(),
                size: 12,
                crc32: 7,
            }],
            files_uploaded: 1,
            bytes_uploaded: 1234,
            offsets: BTreeMap::from([(3, 17)]),
            watermarks: BTreeMap::from([(3, 1_700_000_000_000_000)]),
            splits: BTreeMap::from([(
                5,
                BTreeMap::from([(
                    "files".into(),
                    serde_json::json!({"file": "a.csv", "byte": 9}),
                )]),
            )]),
            failed_actors: vec![1004],
            catalog: serde_json::json!({"objects": []}),
            timings: Timings::default(),
        }
    }

    #[test]
    fn a_manifest_round_trips_and_damage_is_detected() {
        let m = manifest();
        let bytes = m.encode().unwrap();
        assert_eq!(Manifest::decode(&bytes).unwrap(), m);
        // Truncated anywhere, or one byte changed: refused, never half read.
        for cut in [1, bytes.len() / 2, bytes.len() - 1] {
            assert!(Manifest::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut flipped = bytes.clone();
        flipped[10] ^= 0x01;
        let err = Manifest::decode(&flipped).unwrap_err();
        assert_eq!(err.kind, ErrorKind::DataCorruption);
    }

    #[test]
    fn a_format_1_manifest_reads_as_a_base_checkpoint() {
        let mut m = manifest();
        m.deltas.clear();
        let mut json = serde_json::to_value(&m).unwrap();
        let fields = json.as_object_mut().unwrap();
        fields.remove("mode");
        fields.insert("format".into(), 1.into());
        let text = serde_json::to_string(&json).unwrap();
        let crc = crc32fast::hash(text.as_bytes());
        let bytes = format!("{text}\ncrc32 {crc:08x}\n");
        let read = Manifest::decode(bytes.as_bytes()).unwrap();
        assert_eq!((read.format, read.mode), (1, Mode::Base));
        assert!(read.deltas.is_empty());
        // A newer version's manifest is refused as such (not as damage), whatever its shape.
        m.format = FORMAT + 1;
        let refused = Manifest::decode(&m.encode().unwrap()).unwrap_err();
        assert_eq!(refused.kind, ErrorKind::NotSupported, "{refused}");
        let text = format!(r#"{{"format": {}, "files": "elsewhere"}}"#, FORMAT + 1);
        let crc = crc32fast::hash(text.as_bytes());
        let refused =
            Manifest::decode(format!("{text}\ncrc32 {crc:08x}\n").as_bytes()).unwrap_err();
        assert_eq!(refused.kind, ErrorKind::NotSupported, "{refused}");
    }
}
