//! `StateTable`: one operator's ordered key space, with its writes of the current epoch held in
//! memory until the barrier hands them to the store.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use super::{prefix_successor, EpochWrites, StateStore, TableId};
use crate::error::Result;

/// A scan's visitor that can fail: `Ok(false)` ends the scan, an error ends it and is returned.
pub type TryVisit<'a> = dyn FnMut(&[u8], &[u8]) -> Result<bool> + 'a;

/// A pending write: a key and its new value, or `None` for a deletion.
type PendingEntry<'a> = (&'a Vec<u8>, &'a Option<Vec<u8>>);

/// A state table as one actor sees it. Reads see the actor's own uncommitted writes first,
/// then the latest committed state (which only this actor writes, so it is never ahead of it).
pub struct StateTable {
    store: Arc<StateStore>,
    id: TableId,
    /// Writes of the current epoch, by key without the table prefix; `None` is a deletion.
    pending: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// What `pending` takes (estimated), counted in the store's epoch writes.
    pending_bytes: u64,
}

/// What a pending write takes besides its key and value: the map's entry and two vectors.
const PENDING_ENTRY_BYTES: u64 = 96;

fn pending_bytes(key: &[u8], value: Option<&[u8]>) -> u64 {
    PENDING_ENTRY_BYTES + key.len() as u64 + value.map_or(0, |v| v.len() as u64)
}

impl Drop for StateTable {
    fn drop(&mut self) {
        self.store.caches.count_unflushed(0, self.pending_bytes);
    }
}

impl StateTable {
    pub fn new(store: Arc<StateStore>, id: TableId) -> StateTable {
        StateTable {
            store,
            id,
            pending: BTreeMap::new(),
            pending_bytes: 0,
        }
    }

    pub fn id(&self) -> TableId {
        self.id
    }

    fn full_key(&self, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(4 + key.len());
        k.extend_from_slice(&self.id.to_be_bytes());
        k.extend_from_slice(key);
        k
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(v) = self.pending.get(key) {
            return Ok(v.clone());
        }
        self.store.get_latest(&self.full_key(key))
    }

    /// Whether the table holds no entry (committed or of this epoch), in any actor's range.
    pub fn is_empty(&self) -> Result<bool> {
        let mut empty = true;
        self.scan(&[], false, &mut |_, _| {
            empty = false;
            false
        })?;
        Ok(empty)
    }

    /// How many entries the table holds (committed or of this epoch), in any actor's range.
    #[cfg(test)]
    pub fn entries(&self) -> usize {
        let mut n = 0;
        self.scan(&[], false, &mut |_, _| {
            n += 1;
            true
        })
        .expect("scan");
        n
    }

    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.keep(key, Some(value));
    }

    pub fn delete(&mut self, key: Vec<u8>) {
        self.keep(key, None);
    }

    /// Keeps a write for the epoch, and counts what it takes.
    fn keep(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        let added = pending_bytes(&key, value.as_deref());
        let len = key.len();
        let removed = match self.pending.insert(key, value) {
            Some(old) => PENDING_ENTRY_BYTES + len as u64 + old.map_or(0, |v| v.len() as u64),
            None => 0,
        };
        self.pending_bytes = self.pending_bytes + added - removed;
        self.store.caches.count_unflushed(added, removed);
    }

    /// Visits the live entries whose key starts with `prefix`, in key order (or reverse), until
    /// the visitor returns false. Keys are given without the table prefix.
    pub fn scan(
        &self,
        prefix: &[u8],
        reverse: bool,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        self.scan_range(prefix, None, reverse, visit)
    }

    /// Like `scan`, forward, from `start` when given, for a visitor that can fail (decoding
    /// what it reads): its first error ends the scan and is returned.
    pub fn try_scan(
        &self,
        prefix: &[u8],
        start: Option<&[u8]>,
        visit: &mut TryVisit<'_>,
    ) -> Result<()> {
        let mut failed = None;
        self.scan_range(prefix, start, false, &mut |k, v| match visit(k, v) {
            Ok(more) => more,
            Err(e) => {
                failed = Some(e);
                false
            }
        })?;
        failed.map_or(Ok(()), Err)
    }

    /// Whether this epoch wrote (or deleted) a key that starts with `prefix`.
    pub fn wrote_under(&self, prefix: &[u8]) -> bool {
        self.pending
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .next()
            .is_some_and(|(k, _)| k.starts_with(prefix))
    }

    /// Like `try_scan` from the prefix's start, over the committed entries alone: the table
    /// as the last barrier left it, without this epoch's writes.
    pub fn try_scan_committed(&self, prefix: &[u8], visit: &mut TryVisit<'_>) -> Result<()> {
        let mut failed = None;
        self.store.scan_latest(
            &self.full_key(prefix),
            None,
            false,
            &mut |full_key, value| match visit(&full_key[4..], value) {
                Ok(more) => more,
                Err(e) => {
                    failed = Some(e);
                    false
                }
            },
        )?;
        failed.map_or(Ok(()), Err)
    }

    fn scan_range(
        &self,
        prefix: &[u8],
        start: Option<&[u8]>,
        reverse: bool,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        // Committed entries, merged with the pending overlay, which wins on equal keys.
        let upper = match prefix_successor(prefix) {
            Some(u) => Bound::Excluded(u),
            None => Bound::Unbounded,
        };
        let lower = match start {
            Some(s) if s > prefix => s,
            _ => prefix,
        };
        let range = self
            .pending
            .range::<Vec<u8>, _>((Bound::Included(lower.to_vec()), upper));
        let mut overlay: Box<dyn Iterator<Item = PendingEntry<'_>>> = if reverse {
            Box::new(range.rev())
        } else {
            Box::new(range)
        };
        let mut next_overlay = overlay.next();
        let mut stopped = false;
        let before = |a: &[u8], b: &[u8]| if reverse { a > b } else { a < b };
        let full_prefix = self.full_key(prefix);
        let full_start = start.map(|s| self.full_key(s));
        self.store.scan_latest(
            &full_prefix,
            full_start.as_deref(),
            reverse,
            &mut |full_key, value| {
                let key = &full_key[4..];
                // Emit overlay entries that come before this committed key.
                while let Some((ok, ov)) = next_overlay {
                    if before(ok, key) {
                        if let Some(v) = ov {
                            if !visit(ok, v) {
                                stopped = true;
                                return false;
                            }
                        }
                        next_overlay = overlay.next();
                    } else {
                        break;
                    }
                }
                if let Some((ok, ov)) = next_overlay {
                    if ok.as_slice() == key {
                        next_overlay = overlay.next();
                        if let Some(v) = ov {
                            if !visit(ok, v) {
                                stopped = true;
                                return false;
                            }
                        }
                        return true;
                    }
                }
                if !visit(key, value) {
                    stopped = true;
                    return false;
                }
                true
            },
        )?;
        if stopped {
            return Ok(());
        }
        while let Some((ok, ov)) = next_overlay {
            if let Some(v) = ov {
                if !visit(ok, v) {
                    return Ok(());
                }
            }
            next_overlay = overlay.next();
        }
        Ok(())
    }

    /// Moves this epoch's writes into `out`, prefixed with the table id.
    pub fn take_writes(&mut self, out: &mut EpochWrites) {
        let id = self.id.to_be_bytes();
        let pending = std::mem::take(&mut self.pending);
        let counted = std::mem::take(&mut self.pending_bytes);
        self.store.caches.count_unflushed(0, counted);
        let entries = PENDING_ENTRY_BYTES as usize * pending.len();
        let bytes = (counted as usize).saturating_sub(entries) + id.len() * pending.len();
        out.puts.reserve(pending.len(), bytes);
        for (key, value) in &pending {
            out.puts.push(&id, key, value.as_deref());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn table_with(committed: &[(&str, &str)]) -> (tempfile::TempDir, StateTable) {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(dir.path()).unwrap();
        let mut t = StateTable::new(store.clone(), 3);
        for (k, v) in committed {
            t.put(k.as_bytes().to_vec(), v.as_bytes().to_vec());
        }
        let mut w = EpochWrites::default();
        t.take_writes(&mut w);
        store.commit(1, w).await.unwrap();
        store.seal(1);
        (dir, t)
    }

    fn collect(t: &StateTable, prefix: &str, reverse: bool) -> Vec<String> {
        let mut out = vec![];
        t.scan(prefix.as_bytes(), reverse, &mut |k, v| {
            out.push(format!(
                "{}={}",
                String::from_utf8_lossy(k),
                String::from_utf8_lossy(v)
            ));
            true
        })
        .unwrap();
        out
    }

    #[tokio::test]
    async fn wrote_under_sees_only_this_epochs_writes() {
        let (_d, mut t) = table_with(&[("a1", "x")]).await;
        assert!(!t.wrote_under(b"a"));
        t.delete(b"b2".to_vec());
        t.put(b"c".to_vec(), b"y".to_vec());
        assert!(t.wrote_under(b"b") && t.wrote_under(b"b2") && t.wrote_under(b""));
        assert!(!t.wrote_under(b"a") && !t.wrote_under(b"b3") && !t.wrote_under(b"bb"));
    }

    #[tokio::test]
    async fn scan_merges_pending_over_committed() {
        let (_d, mut t) = table_with(&[("a1", "x"), ("a3", "x"), ("a5", "x"), ("b1", "x")]).await;
        t.put(b"a2".to_vec(), b"new".to_vec());
        t.put(b"a3".to_vec(), b"upd".to_vec());
        t.delete(b"a5".to_vec());
        t.put(b"a9".to_vec(), b"new".to_vec());
        assert_eq!(
            collect(&t, "a", false),
            ["a1=x", "a2=new", "a3=upd", "a9=new"]
        );
        assert_eq!(
            collect(&t, "a", true),
            ["a9=new", "a3=upd", "a2=new", "a1=x"]
        );
        assert_eq!(collect(&t, "b", false), ["b1=x"]);
        let mut first = None;
        t.scan(b"a", true, &mut |k, _| {
            first = Some(k.to_vec());
            false
        })
        .unwrap();
        assert_eq!(first.as_deref(), Some(&b"a9"[..]));
    }

    #[tokio::test]
    async fn scan_from_skips_keys_below_the_start() {
        let (_d, mut t) = table_with(&[("a1", "x"), ("a3", "x"), ("a5", "x"), ("b1", "x")]).await;
        t.put(b"a4".to_vec(), b"new".to_vec());
        t.delete(b"a5".to_vec());
        t.put(b"a2".to_vec(), b"new".to_vec());
        let mut seen = vec![];
        t.try_scan(b"a", Some(b"a3"), &mut |k, _| {
            seen.push(String::from_utf8_lossy(k).to_string());
            Ok(true)
        })
        .unwrap();
        assert_eq!(seen, ["a3", "a4"]);
        // A start below the prefix scans the whole prefix.
        let mut all = 0;
        t.try_scan(b"a", Some(b""), &mut |_, _| {
            all += 1;
            Ok(true)
        })
        .unwrap();
        assert_eq!(all, 4);
        // A visitor's error ends the scan and comes back.
        let mut visited = 0;
        let err = t
            .try_scan(b"a", None, &mut |_, _| {
                visited += 1;
                Err(crate::error::Error::internal("bad entry"))
            })
            .unwrap_err();
        assert_eq!((visited, err.message.as_str()), (1, "bad entry"));
    }
}
