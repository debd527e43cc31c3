//! The checkpoint ledger: the retained checkpoints, the objects they name, and the decisions
//! that follow from them. Pure logic: the caller lists files, uploads, writes manifests and
//! deletes objects.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

/// A file of a RocksDB checkpoint, as found in its staging directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalFile {
    pub name: String,
    pub size: u64,
}

impl LocalFile {
    /// SST files are immutable and may be shared between checkpoints; the rest (`MANIFEST`,
    /// `CURRENT`, `OPTIONS`) are rewritten by every checkpoint.
    pub fn is_sst(&self) -> bool {
        self.name.ends_with(".sst")
    }
}

/// A file a checkpoint references: the object holding it and what it was locally.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    pub object: String,
    pub local: String,
    pub size: u64,
    pub crc32: u32,
}

/// What the ledger needs of a completed checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    pub id: u64,
    /// The files of its RocksDB checkpoint (of its base, for a delta checkpoint).
    pub files: Vec<FileRef>,
    /// The deltas since its base, oldest first.
    pub deltas: Vec<FileRef>,
}

impl Completed {
    pub fn objects(&self) -> impl Iterator<Item = &FileRef> {
        self.files.iter().chain(&self.deltas)
    }
}

/// What a checkpoint must do with each of its files.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Files to upload, and the object each goes to.
    pub upload: Vec<(LocalFile, String)>,
    /// Files the last completed checkpoint already uploaded.
    pub reuse: Vec<FileRef>,
}

/// What completing a checkpoint retires.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Retired {
    /// Checkpoints past the retention limit, oldest first: their manifests go first.
    pub expired: Vec<u64>,
    /// Objects no retained checkpoint names any more, in name order.
    pub delete: Vec<String>,
}

/// The directory of checkpoint `id`'s own objects.
pub fn checkpoint_dir(id: u64) -> String {
    format!("checkpoints/{id:020}")
}

/// The object holding checkpoint `id`'s manifest.
pub fn manifest_object(id: u64) -> String {
    format!("{}/manifest.json", checkpoint_dir(id))
}

pub struct Ledger {
    /// Distinguishes this run's local file names from every other run's.
    run: String,
    retained_max: usize,
    /// Completed checkpoints still retained, oldest first.
    retained: VecDeque<Completed>,
    /// How many retained checkpoints name each object.
    refs: BTreeMap<String, usize>,
    /// Objects uploaded by checkpoints that failed, to delete unless a later one names them.
    orphans: BTreeSet<String>,
    /// The checkpoint this run's RocksDB was restored from: its files are on disk under their
    /// local names, byte for byte, so they are reused by name although another run uploaded
    /// them.
    restored: Option<u64>,
    /// The checkpoint whose state the store's writes since are relative to: the last one
    /// completed by this run, or the one it was restored from; none after a failure (the
    /// writes it took are in no checkpoint). A delta checkpoint extends it.
    extendable: Option<u64>,
}

impl Ledger {
    pub fn new(run: impl Into<String>, retained_max: usize) -> Ledger {
        Ledger {
            run: run.into(),
            retained_max: retained_max.max(1),
            retained: VecDeque::new(),
            refs: BTreeMap::new(),
            orphans: BTreeSet::new(),
            restored: None,
            extendable: None,
        }
    }

    /// Says that this run's RocksDB was restored from adopted checkpoint `id`.
    pub fn restored_from(&mut self, id: u64) {
        self.restored = Some(id);
        self.extendable = Some(id);
    }

    /// The checkpoint a delta checkpoint may extend: the newest retained one, if the store's
    /// writes since it were all kept (see `extendable`).
    pub fn chain(&self) -> Option<&Completed> {
        self.retained
            .back()
            .filter(|c| Some(c.id) == self.extendable)
    }

    /// The object and local file name of checkpoint `id`'s delta, or of its file `part` when
    /// it has several.
    pub fn delta_names(&self, id: u64, part: usize) -> (String, String) {
        let local = match part {
            0 => format!("{}-delta-{id:020}.sst", self.run),
            _ => format!("{}-delta-{id:020}-{part}.sst", self.run),
        };
        (format!("shared/{local}"), local)
    }

    /// The objects that retained checkpoints name, with how many name each.
    #[cfg(test)]
    pub fn ref_counts(&self) -> &BTreeMap<String, usize> {
        &self.refs
    }

    /// The retained checkpoints, oldest first.
    pub fn retained(&self) -> impl Iterator<Item = &Completed> {
        self.retained.iter()
    }

    /// Decides, for checkpoint `id` of `files`, what to upload and what to reuse. Only files of
    /// the last completed checkpoint are reused, and only SSTs whose name and size match: this
    /// run's uploads, or any of the checkpoint this run was restored from; in full mode
    /// (`incremental` false) every file is uploaded into the checkpoint's own directory.
    pub fn plan(&self, id: u64, files: &[LocalFile], incremental: bool) -> Plan {
        let last: HashMap<&str, &FileRef> = match (incremental, self.retained.back()) {
            (true, Some(c)) => c.files.iter().map(|f| (f.local.as_str(), f)).collect(),
            _ => HashMap::new(),
        };
        let from_restored =
            self.restored.is_some() && self.retained.back().map(|c| c.id) == self.restored;
        let mut plan = Plan::default();
        for file in files {
            let shared = format!("shared/{}-{}", self.run, file.name);
            match last.get(file.name.as_str()) {
                // Only this run's uploads, or the restored checkpoint's: another run's file of
                // the same name is another file.
                Some(f)
                    if file.is_sst()
                        && f.size == file.size
                        && (f.object == shared || from_restored) =>
                {
                    plan.reuse.push((*f).clone())
                }
                _ => {
                    let object = if incremental && file.is_sst() {
                        shared
                    } else {
                        format!("{}/{}", checkpoint_dir(id), file.name)
                    };
                    plan.upload.push((file.clone(), object));
                }
            }
        }
        plan
    }

    /// Takes in a checkpoint found in the store, as retained: it expires in its turn. Its
    /// files are not reused by name (they are another run's), unless this run was restored
    /// from it (`restored_from`).
    pub fn adopt(&mut self, checkpoint: Completed) {
        for f in checkpoint.objects() {
            *self.refs.entry(f.object.clone()).or_default() += 1;
        }
        self.retained.push_back(checkpoint);
    }

    /// Records a checkpoint whose manifest is written: it becomes the newest, the oldest ones
    /// beyond the retention limit expire unless `pinned` (being read: they expire at a later
    /// completion), and the objects nobody names any more are returned for deletion (with
    /// those of failed checkpoints that this one does not name).
    pub fn complete(&mut self, checkpoint: Completed, pinned: &BTreeSet<u64>) -> Retired {
        for f in checkpoint.objects() {
            *self.refs.entry(f.object.clone()).or_default() += 1;
        }
        self.extendable = Some(checkpoint.id);
        self.retained.push_back(checkpoint);
        let mut retired = Retired::default();
        let mut released = BTreeSet::new();
        let excess = self.retained.len().saturating_sub(self.retained_max);
        let mut kept = VecDeque::with_capacity(self.retained.len());
        for (i, old) in std::mem::take(&mut self.retained).into_iter().enumerate() {
            if i >= excess || pinned.contains(&old.id) {
                kept.push_back(old);
                continue;
            }
            for f in old.objects() {
                if let Some(n) = self.refs.get_mut(&f.object) {
                    *n -= 1;
                    if *n == 0 {
                        self.refs.remove(&f.object);
                        released.insert(f.object.clone());
                    }
                }
            }
            retired.expired.push(old.id);
        }
        self.retained = kept;
        let orphans = std::mem::take(&mut self.orphans);
        released.extend(orphans.into_iter().filter(|o| !self.refs.contains_key(o)));
        retired.delete = released.into_iter().collect();
        retired
    }

    /// Records a checkpoint that failed after uploading `uploaded`: nothing retained changes,
    /// and its objects are deleted at the next completion unless that one names them.
    /// The next checkpoint is a base one: the writes this one took are in no checkpoint.
    pub fn fail(&mut self, uploaded: impl IntoIterator<Item = String>) {
        self.orphans.extend(uploaded);
        self.extendable = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sst(n: &str) -> LocalFile {
        LocalFile {
            name: format!("{n}.sst"),
            size: 1000 + n.len() as u64,
        }
    }

    /// Runs one checkpoint: plans it, "uploads" (checksum = size), completes it. Returns the
    /// local names uploaded and what completing it deleted, as local names.
    fn checkpoint(ledger: &mut Ledger, id: u64, files: &[&str]) -> (Vec<String>, Vec<String>) {
        checkpoint_pinned(ledger, id, files, &BTreeSet::new())
    }

    /// Like `checkpoint`, with the checkpoints in `pinned` being read.
    fn checkpoint_pinned(
        ledger: &mut Ledger,
        id: u64,
        files: &[&str],
        pinned: &BTreeSet<u64>,
    ) -> (Vec<String>, Vec<String>) {
        let files: Vec<LocalFile> = files.iter().map(|n| sst(n)).collect();
        let plan = ledger.plan(id, &files, true);
        let uploaded: Vec<String> = plan.upload.iter().map(|(f, _)| local(&f.name)).collect();
        let mut refs = plan.reuse.clone();
        refs.extend(plan.upload.iter().map(|(f, object)| FileRef {
            object: object.clone(),
            local: f.name.clone(),
            size: f.size,
            crc32: f.size as u32,
        }));
        let retired = ledger.complete(
            Completed {
                id,
                files: refs,
                deltas: vec![],
            },
            pinned,
        );
        let deleted = retired
            .delete
            .iter()
            .map(|o| local(o.trim_start_matches("shared/run-")))
            .collect();
        (uploaded, deleted)
    }

    fn local(name: &str) -> String {
        name.trim_end_matches(".sst").to_string()
    }

    fn counts(ledger: &Ledger) -> Vec<(String, usize)> {
        let mut counts: Vec<(String, usize)> = ledger
            .ref_counts()
            .iter()
            .map(|(o, n)| (local(o.trim_start_matches("shared/run-")), *n))
            .collect();
        counts.sort_by_key(|(name, _)| (name.len(), name.clone()));
        counts
    }

    fn pairs(expected: &[(&str, usize)]) -> Vec<(String, usize)> {
        expected.iter().map(|(n, c)| (n.to_string(), *c)).collect()
    }

    /// The worked example of DESIGN.md ("Checkpoints"), two checkpoints retained.
    #[test]
    fn the_worked_example() {
        let mut ledger = Ledger::new("run", 2);

        let (up, del) = checkpoint(&mut ledger, 1, &["1", "2"]);
        assert_eq!(up, ["1", "2"]);
        assert!(del.is_empty());
        assert_eq!(counts(&ledger), pairs(&[("1", 1), ("2", 1)]));

        let (up, del) = checkpoint(&mut ledger, 2, &["1", "2", "3", "4"]);
        assert_eq!(up, ["3", "4"]);
        assert!(del.is_empty());
        assert_eq!(
            counts(&ledger),
            pairs(&[("1", 2), ("2", 2), ("3", 1), ("4", 1)])
        );

        // Compaction merged 1, 2 and 3 into 123; CP1 expires.
        let (up, del) = checkpoint(&mut ledger, 3, &["123", "4", "5"]);
        assert_eq!(up, ["123", "5"]);
        assert!(del.is_empty());
        assert_eq!(
            counts(&ledger),
            pairs(&[("1", 1), ("2", 1), ("3", 1), ("4", 2), ("5", 1), ("123", 1)])
        );

        // Compaction merged 4, 5 and the new 6 into 456; CP2 expires, and with it 1, 2, 3.
        let (up, del) = checkpoint(&mut ledger, 4, &["123", "456"]);
        assert_eq!(up, ["456"]);
        assert_eq!(del, ["1", "2", "3"]);
        assert_eq!(
            counts(&ledger),
            pairs(&[("4", 1), ("5", 1), ("123", 2), ("456", 1)])
        );
        let retained: Vec<u64> = ledger.retained().map(|c| c.id).collect();
        assert_eq!(retained, [3, 4]);
    }

    #[test]
    fn a_pinned_checkpoint_outlives_its_retention_until_a_completion_after_it_is_unpinned() {
        let mut ledger = Ledger::new("run", 1);
        checkpoint(&mut ledger, 1, &["1", "2"]);
        let (_, del) = checkpoint_pinned(&mut ledger, 2, &["2", "3"], &BTreeSet::from([1]));
        assert!(del.is_empty());
        assert_eq!(ledger.retained().map(|c| c.id).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(counts(&ledger), pairs(&[("1", 1), ("2", 2), ("3", 1)]));
        let (_, del) = checkpoint(&mut ledger, 3, &["3", "4"]);
        assert_eq!(del, ["1", "2"]);
        assert_eq!(ledger.retained().map(|c| c.id).collect::<Vec<_>>(), [3]);
    }

    #[test]
    fn a_file_is_reused_only_from_the_last_completed_checkpoint_with_its_size() {
        let mut ledger = Ledger::new("run", 2);
        checkpoint(&mut ledger, 1, &["1", "2"]);
        // A failed checkpoint uploaded 3; the next one uploads it again (same name, same
        // bytes) rather than trusting an upload no manifest vouches for.
        let plan = ledger.plan(2, &[sst("1"), sst("2"), sst("3")], true);
        assert_eq!(plan.upload.len(), 1);
        ledger.fail(plan.upload.iter().map(|(_, o)| o.clone()));
        let (up, del) = checkpoint(&mut ledger, 3, &["1", "2", "3"]);
        assert_eq!(up, ["3"]);
        assert!(del.is_empty(), "3 is named again: {del:?}");
        // A local file of the same name but another size is not the same file.
        let mut changed = sst("1");
        changed.size += 1;
        let plan = ledger.plan(4, &[changed], true);
        assert!(plan.reuse.is_empty());
    }

    #[test]
    fn files_of_another_run_are_not_reused_by_name() {
        let mut previous = Ledger::new("old", 2);
        checkpoint(&mut previous, 1, &["1", "2"]);
        let mut ledger = Ledger::new("run", 2);
        for c in previous.retained() {
            ledger.adopt(c.clone());
        }
        // A fresh RocksDB numbers its files from the start again: same names, other data.
        let (up, _) = checkpoint(&mut ledger, 2, &["1", "2"]);
        assert_eq!(up, ["1", "2"]);
        // Both runs' objects are counted until the old checkpoint expires.
        assert_eq!(ledger.ref_counts().len(), 4);
        let plan = ledger.plan(4, &[sst("1")], true);
        let retired = ledger.complete(
            Completed {
                id: 4,
                files: plan.reuse.clone(),
                deltas: vec![],
            },
            &BTreeSet::new(),
        );
        assert_eq!(retired.expired, [1]);
        assert_eq!(retired.delete, ["shared/old-1.sst", "shared/old-2.sst"]);
    }

    #[test]
    fn the_files_of_the_restored_checkpoint_are_reused_by_name() {
        let mut previous = Ledger::new("old", 2);
        checkpoint(&mut previous, 1, &["1"]);
        checkpoint(&mut previous, 2, &["1", "2"]);
        let mut ledger = Ledger::new("run", 2);
        for c in previous.retained() {
            ledger.adopt(c.clone());
        }
        ledger.restored_from(2);
        // A file of the restored checkpoint's name but another size is another file.
        let mut grown = sst("2");
        grown.size += 1;
        assert!(ledger.plan(3, &[grown], true).reuse.is_empty());
        // RocksDB restored from 2 holds its files and numbers new ones above them.
        let (up, deleted) = checkpoint(&mut ledger, 3, &["1", "3"]);
        assert_eq!(up, ["3"]);
        assert_eq!(
            deleted,
            Vec::<String>::new(),
            "1 expired, its file still named"
        );
        assert_eq!(
            ledger.retained().last().unwrap().files[0].object,
            "shared/old-1.sst"
        );

        // Restored from an older checkpoint than the newest adopted: nothing is reused.
        let mut ledger = Ledger::new("run", 2);
        for c in previous.retained() {
            ledger.adopt(c.clone());
        }
        ledger.restored_from(1);
        assert!(ledger.plan(3, &[sst("1")], true).reuse.is_empty());
    }

    /// Completes delta checkpoint `id` over the chain: its base's files, the chain's deltas
    /// and its own. Returns what completing it deleted.
    fn delta(ledger: &mut Ledger, id: u64) -> Vec<String> {
        let last = ledger.chain().expect("a chain to extend").clone();
        let (object, local) = ledger.delta_names(id, 0);
        let mut deltas = last.deltas.clone();
        deltas.push(FileRef {
            object,
            local,
            size: 10,
            crc32: 0,
        });
        ledger
            .complete(
                Completed {
                    id,
                    files: last.files,
                    deltas,
                },
                &BTreeSet::new(),
            )
            .delete
    }

    #[test]
    fn deltas_extend_the_last_checkpoint_and_go_when_no_retained_one_names_them() {
        let mut ledger = Ledger::new("run", 2);
        assert!(
            ledger.chain().is_none(),
            "the first checkpoint is a base one"
        );
        checkpoint(&mut ledger, 1, &["1", "2"]);
        assert_eq!(delta(&mut ledger, 2), Vec::<String>::new());
        // 1 expires, but 3 names its files through its base.
        assert_eq!(delta(&mut ledger, 3), Vec::<String>::new());
        assert_eq!(
            ledger
                .ref_counts()
                .get("shared/run-delta-00000000000000000002.sst"),
            Some(&2)
        );
        assert_eq!(ledger.ref_counts().get("shared/run-1.sst"), Some(&2));
        // A base checkpoint after compaction (2 into 4): 2 expires; its delta is still named
        // by 3, and file 2 too.
        let (up, deleted) = checkpoint(&mut ledger, 4, &["1", "4"]);
        assert_eq!(up, ["4"]);
        assert!(deleted.is_empty(), "{deleted:?}");
        // 3 expires: its deltas and file 2 go.
        let (_, deleted) = checkpoint(&mut ledger, 5, &["1", "4"]);
        assert_eq!(
            deleted,
            [
                "2",
                "delta-00000000000000000002",
                "delta-00000000000000000003"
            ]
        );
        // A failed checkpoint took writes no checkpoint holds: the next one is a base one.
        ledger.fail(Vec::new());
        assert!(ledger.chain().is_none());
        checkpoint(&mut ledger, 7, &["1", "4"]);
        assert_eq!(ledger.chain().map(|c| c.id), Some(7));
        // Restored from the newest adopted checkpoint: the chain goes on from it.
        let mut restored = Ledger::new("next", 2);
        for c in ledger.retained() {
            restored.adopt(c.clone());
        }
        assert!(restored.chain().is_none());
        restored.restored_from(7);
        assert_eq!(restored.chain().map(|c| c.id), Some(7));
    }

    #[test]
    fn uploads_of_a_failed_checkpoint_are_deleted_when_nothing_names_them() {
        let mut ledger = Ledger::new("run", 1);
        checkpoint(&mut ledger, 1, &["1"]);
        let plan = ledger.plan(2, &[sst("1"), sst("2")], true);
        ledger.fail(plan.upload.iter().map(|(_, o)| o.clone()));
        // By the next checkpoint, 2 was compacted into 3.
        let (up, del) = checkpoint(&mut ledger, 3, &["1", "3"]);
        assert_eq!(up, ["3"]);
        assert_eq!(del, ["2"]);
    }

    #[test]
    fn full_mode_uploads_everything_into_the_checkpoints_own_directory() {
        let mut ledger = Ledger::new("run", 1);
        let files = [
            sst("1"),
            LocalFile {
                name: "MANIFEST-000005".into(),
                size: 10,
            },
        ];
        for id in 1..=2 {
            let plan = ledger.plan(id, &files, false);
            assert!(plan.reuse.is_empty());
            let objects: Vec<&str> = plan.upload.iter().map(|(_, o)| o.as_str()).collect();
            let dir = checkpoint_dir(id);
            assert_eq!(
                objects,
                [format!("{dir}/1.sst"), format!("{dir}/MANIFEST-000005")]
            );
            let refs = plan
                .upload
                .into_iter()
                .map(|(f, object)| FileRef {
                    object,
                    local: f.name,
                    size: f.size,
                    crc32: 0,
                })
                .collect();
            let retired = ledger.complete(
                Completed {
                    id,
                    files: refs,
                    deltas: vec![],
                },
                &BTreeSet::new(),
            );
            if id == 2 {
                // The first checkpoint expired with all its files.
                assert_eq!(retired.expired, [1]);
                assert_eq!(retired.delete.len(), 2);
                assert!(retired
                    .delete
                    .iter()
                    .all(|o| o.starts_with(&checkpoint_dir(1))));
            }
        }
    }

    #[test]
    fn non_sst_files_are_never_shared() {
        let mut ledger = Ledger::new("run", 2);
        let files = [LocalFile {
            name: "CURRENT".into(),
            size: 16,
        }];
        let plan = ledger.plan(1, &files, true);
        assert_eq!(plan.upload[0].1, format!("{}/CURRENT", checkpoint_dir(1)));
        let refs = vec![FileRef {
            object: plan.upload[0].1.clone(),
            local: "CURRENT".into(),
            size: 16,
            crc32: 0,
        }];
        ledger.complete(
            Completed {
                id: 1,
                files: refs,
                deltas: vec![],
            },
            &BTreeSet::new(),
        );
        let plan = ledger.plan(2, &files, true);
        assert!(plan.reuse.is_empty());
        assert_eq!(plan.upload[0].1, format!("{}/CURRENT", checkpoint_dir(2)));
    }
}
