//! Shipped change-log segments (`checkpoint.ship_logs_ms`): records `[first, end)` of a
//! table's change log, as the log holds them, in the object `logs/<table>/<first>-<end>`
//! (zero-padded, so name order is record order). A restore from the store alone replays them
//! after the checkpoint's offset; segments wholly below a table's truncation floor are deleted.

use std::path::Path;

use bytes::Bytes;

use super::storage::Storage;
use crate::changelog::ChangeLog;
use crate::error::{Error, ErrorKind, Result};

/// One shipped segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub name: String,
    pub first: u64,
    pub end: u64,
}

fn prefix(table: u32) -> String {
    format!("logs/{table}/")
}

/// Uploads records `[first, end)` of `table`'s log (`bytes`, whole records).
pub async fn ship(
    storage: &Storage,
    table: u32,
    first: u64,
    end: u64,
    bytes: Vec<u8>,
) -> Result<()> {
    let name = format!("{}{first:020}-{end:020}", prefix(table));
    storage.put(&name, Bytes::from(bytes)).await
}

/// The segments of `table` in the store, by first record.
pub async fn segments(storage: &Storage, table: u32) -> Result<Vec<Segment>> {
    let listed = storage.list(&prefix(table)).await?;
    Ok(segments_in(listed.iter().map(|(name, _)| name), table))
}

/// The segments of `table` among the objects named `objects` (a listing of the store), by
/// first record.
pub fn segments_in<'a>(objects: impl IntoIterator<Item = &'a String>, table: u32) -> Vec<Segment> {
    let prefix = prefix(table);
    let mut out: Vec<Segment> = objects
        .into_iter()
        .filter_map(|name| {
            let (first, end) = name.strip_prefix(&prefix)?.split_once('-')?;
            Some(Segment {
                first: first.parse().ok()?,
                end: end.parse().ok()?,
                name: name.clone(),
            })
        })
        .collect();
    out.sort_by_key(|s| (s.first, s.end));
    out
}

/// The segments that continue `table`'s records from `from` without a gap, in order.
pub fn chain(segments: &[Segment], from: u64) -> Vec<Segment> {
    let mut next = from;
    let mut out = Vec::new();
    for s in segments {
        if s.first <= next && s.end > next {
            next = s.end;
            out.push(s.clone());
        }
    }
    out
}

/// Deletes `table`'s segments that end at or below `floor`: every retained checkpoint holds
/// their records.
pub async fn collect(storage: &Storage, table: u32, floor: u64) -> Result<()> {
    for s in segments(storage, table).await? {
        if s.end <= floor {
            storage.delete(&s.name).await?;
        }
    }
    Ok(())
}

/// Creates table `table`'s log in `tables_dir` empty at record `offset` (a table restored
/// from a checkpoint without its log) and appends the records of the `shipped` segments
/// after the offset, as far as they continue.
pub async fn restore(
    storage: &Storage,
    shipped: &[Segment],
    tables_dir: &Path,
    table: u32,
    offset: u64,
) -> Result<()> {
    let mut log = ChangeLog::create_at(tables_dir, table, offset)?;
    for segment in chain(shipped, offset) {
        let bytes = storage.get(&segment.name).await?;
        let chunks = ChangeLog::decode_segment(&bytes, &segment.name)?;
        if chunks.len() as u64 != segment.end - segment.first {
            return Err(Error::new(
                ErrorKind::DataCorruption,
                format!(
                    "log segment {} holds {} records",
                    segment.name,
                    chunks.len()
                ),
            ));
        }
        let skip = (log.next_record() - segment.first) as usize;
        log.append_all(&chunks[skip..])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(first: u64, end: u64) -> Segment {
        Segment {
            name: format!("{first}-{end}"),
            first,
            end,
        }
    }

    #[test]
    fn a_chain_continues_from_the_offset_and_stops_at_a_gap() {
        let all = [seg(0, 4), seg(4, 6), seg(6, 9), seg(11, 12)];
        let ends: Vec<u64> = chain(&all, 5).iter().map(|s| s.end).collect();
        assert_eq!(
            ends,
            [6, 9],
            "the segment holding record 5, then on; 9..11 is missing"
        );
        assert!(chain(&all, 9).is_empty());
        assert_eq!(chain(&all, 0).len(), 3);
    }

    #[test]
    fn a_tables_segments_are_read_from_a_listing_of_the_whole_store() {
        let objects: Vec<String> = [
            "checkpoints/00000000000000000003/manifest.json",
            "logs/1/00000000000000000004-00000000000000000006",
            "logs/1/00000000000000000000-00000000000000000004",
            "logs/12/00000000000000000000-00000000000000000009",
            "logs/1/not-a-segment",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        let found: Vec<(u64, u64)> = segments_in(&objects, 1)
            .iter()
            .map(|s| (s.first, s.end))
            .collect();
        assert_eq!(found, [(0, 4), (4, 6)], "table 12's are not table 1's");
    }
}
