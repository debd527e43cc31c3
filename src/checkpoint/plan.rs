//! Recovery's decisions, as pure functions of what the store held at start (`StoreContents`,
//! read once by `restore::read_store`) and what the data directory holds: which checkpoints
//! are whole and in which order to try them, whether to start without one or refuse, which
//! manifests the checkpointer adopts, and which objects a crash left behind for the sweep;
//! and the checkpointer's own decisions as it runs: whether a checkpoint may be a delta of
//! the last one, what the state store keeps for deltas, and where each table's log may be
//! truncated. The drivers (`db::recovery`,
//! the checkpointer) carry them out; no I/O here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::ledger::{Completed, FileRef};
use super::manifest::Manifest;
use super::restore::Damaged;
use crate::config::CheckpointConfig;
use crate::error::{Error, ErrorKind, Result};
use crate::state::Keep;

/// A delta checkpoint is taken only while its chain references at most this many times the
/// state's size (`StateStore::size_bytes`); past it, a base checkpoint.
const REFERENCED_MAX: u64 = 2;

/// Whether the next checkpoint may be a delta extending `last` (the newest completed one):
/// not asked to be a base, incremental, fewer than `max_deltas` deltas since its base, and
/// not more than `REFERENCED_MAX` times the state's size (`state_bytes`) referenced (each
/// delta adds the changes of its interval, including new values of keys the base or an
/// older delta holds).
pub fn may_extend(
    last: &Completed,
    base_asked: bool,
    incremental: bool,
    max_deltas: usize,
    state_bytes: u64,
) -> bool {
    let referenced: u64 = last.objects().map(|f| f.size).sum();
    !base_asked
        && incremental
        && last.deltas.len() < max_deltas
        && referenced <= REFERENCED_MAX.saturating_mul(state_bytes)
}

/// What the state store keeps of the writes between checkpoints: nothing when every
/// checkpoint is a base one, else the writes, written ahead into `deltas` in parts of
/// `delta_part_bytes` unless that is 0.
pub fn keep(config: &CheckpointConfig, deltas: &Path) -> Keep {
    if !config.incremental || config.max_deltas == 0 {
        Keep::Nothing
    } else if config.delta_part_bytes == 0 {
        Keep::Writes
    } else {
        Keep::Ahead {
            dir: deltas.to_path_buf(),
            part_bytes: config.delta_part_bytes,
        }
    }
}

/// Where each table's log may be truncated: below the least record any retained checkpoint
/// holds of it (`offsets`: each retained checkpoint's offset per table). A table a retained
/// checkpoint does not name (created after it) keeps its whole log.
pub fn log_floors(offsets: &BTreeMap<u64, BTreeMap<u32, u64>>) -> BTreeMap<u32, u64> {
    let tables: BTreeSet<u32> = offsets.values().flat_map(|o| o.keys().copied()).collect();
    tables
        .into_iter()
        .map(|t| {
            let floor = offsets.values().map(|o| o.get(&t).copied().unwrap_or(0));
            (t, floor.min().unwrap_or(0))
        })
        .collect()
}

/// What the store held at start.
#[derive(Debug, Default)]
pub struct StoreContents {
    /// Every object and its size.
    pub objects: BTreeMap<String, u64>,
    /// Every manifest object, in id order, as it decoded (or why it did not).
    pub manifests: Vec<(String, Result<Manifest>)>,
}

impl StoreContents {
    /// The names of the manifest objects among `objects`, in id order (ids are zero-padded,
    /// so name order is id order).
    pub fn manifest_names(objects: &BTreeMap<String, u64>) -> Vec<String> {
        objects
            .keys()
            .filter(|n| n.starts_with("checkpoints/") && n.ends_with("/manifest.json"))
            .cloned()
            .collect()
    }
}

/// The checkpoints a restore tries, in order.
#[derive(Debug)]
pub struct RecoveryPlan {
    /// Every whole checkpoint (its manifest checks, its catalog reads, and every file it names
    /// is in the store with its recorded size), newest first: the first is restored, and if
    /// one of its files turns out damaged while it is rebuilt, the next.
    pub candidates: Vec<Manifest>,
    /// Every manifest that is not whole, newest first, and why.
    pub damaged: Vec<Damaged>,
}

/// The checkpoints to try, newest first, and the damaged ones. A manifest or catalog written
/// by a newer version of Weir refuses the start (0A000): this version would restore an older
/// checkpoint in its place, or misread it.
pub fn recovery_plan(store: &StoreContents) -> Result<RecoveryPlan> {
    let mut plan = RecoveryPlan {
        candidates: Vec::new(),
        damaged: Vec::new(),
    };
    for (name, decoded) in store.manifests.iter().rev() {
        let problem = match decoded {
            Err(e) if e.kind == ErrorKind::NotSupported => return Err(newer(name, e)),
            Err(e) => e.message.clone(),
            // A catalog that cannot be read is as damaging as a missing file: the state
            // cannot be told apart without it.
            Ok(m) => match crate::catalog::Catalog::objects_in(&m.catalog) {
                Err(e) if e.kind == ErrorKind::NotSupported => return Err(newer(name, &e)),
                Err(e) => e.message,
                Ok(_) => match m.objects().find_map(|f| missing(f, &store.objects)) {
                    Some(reason) => reason,
                    None => {
                        plan.candidates.push(m.clone());
                        continue;
                    }
                },
            },
        };
        plan.damaged.push(Damaged {
            manifest: name.clone(),
            reason: problem,
        });
    }
    Ok(plan)
}

fn newer(manifest: &str, e: &Error) -> Error {
    Error::not_supported(format!(
        "the checkpoint store holds {manifest}, written by a newer version of Weir: {}",
        e.message
    ))
    .with_hint("Start the version of Weir that wrote it, or a newer one.")
}

fn missing(file: &FileRef, objects: &BTreeMap<String, u64>) -> Option<String> {
    match objects.get(&file.object) {
        None => Some(format!("{} is missing", file.object)),
        Some(size) if *size != file.size => Some(format!(
            "{} has {size} bytes, the manifest says {}",
            file.object, file.size
        )),
        Some(_) => None,
    }
}

/// With no checkpoint restored, every view is rebuilt from the tables' change logs: exact only
/// while every log starts at record 0. `truncated` is the first table whose log does not, and
/// where it starts; then the start is refused, naming `damaged` (why no checkpoint could be
/// restored).
pub fn without_checkpoint(damaged: &[Damaged], truncated: Option<(u32, u64)>) -> Result<()> {
    let Some((table, base)) = truncated else {
        return Ok(());
    };
    let reasons: Vec<String> = damaged
        .iter()
        .map(|d| format!("{}: {}", d.manifest, d.reason))
        .collect();
    let found = match reasons.is_empty() {
        true => "the checkpoint store holds no checkpoint".to_string(),
        false => format!(
            "no checkpoint in the store can be restored ({})",
            reasons.join("; ")
        ),
    };
    Err(Error::new(
        ErrorKind::DataCorruption,
        format!(
            "{found}, and the change logs were truncated after checkpoints (table {table}'s \
             starts at record {base}), so the views cannot be rebuilt from them; restore the \
             checkpoint store from a backup"
        ),
    ))
}

/// A manifest the checkpointer leaves alone: its object, its decoded manifest where it has
/// one, and why.
pub type LeftAlone<'a> = (&'a str, Option<&'a Manifest>, String);

/// The manifests the checkpointer adopts (those that decoded and that the restore did not find
/// damaged), oldest first; and each other one.
pub fn adopted<'a>(
    store: &'a StoreContents,
    damaged: &[Damaged],
) -> (Vec<&'a Manifest>, Vec<LeftAlone<'a>>) {
    let mut usable = Vec::new();
    let mut unusable = Vec::new();
    for (name, decoded) in &store.manifests {
        let known = damaged.iter().find(|d| d.manifest == *name);
        match (decoded, known) {
            (Ok(m), None) => usable.push(m),
            (decoded, Some(d)) => {
                unusable.push((name.as_str(), decoded.as_ref().ok(), d.reason.clone()))
            }
            (Err(e), None) => unusable.push((name.as_str(), None, e.message.clone())),
        }
    }
    usable.sort_by_key(|m| m.id);
    (usable, unusable)
}

/// What a crash left behind in the store, for the sweep to delete: objects of checkpoints
/// that never got a manifest (and that no other manifest names), and shared objects no
/// manifest names. `manifests` are those adopted; if any manifest could not be read, nothing
/// is an orphan: the damaged one may name them.
pub fn orphans(store: &StoreContents, manifests: &[&Manifest]) -> Vec<String> {
    let named: BTreeSet<&str> = manifests
        .iter()
        .flat_map(|m| m.objects().map(|f| f.object.as_str()))
        .collect();
    let with_manifest: BTreeSet<&str> = (store.objects.keys())
        .filter_map(|n| n.strip_suffix("/manifest.json"))
        .collect();
    if manifests.len() != with_manifest.len() {
        return Vec::new();
    }
    let orphan = |name: &str| {
        if let Some(rest) = name.strip_prefix("checkpoints/") {
            // A delta checkpoint names its base's own files, also once the base expired.
            let dir = rest.split('/').next().unwrap_or_default();
            !with_manifest.contains(format!("checkpoints/{dir}").as_str()) && !named.contains(name)
        } else {
            name.starts_with("shared/") && !named.contains(name)
        }
    };
    (store.objects.keys())
        .filter(|n| orphan(n))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delta_extends_the_last_checkpoint_only_within_its_bounds() {
        let last = |deltas: usize, size: u64| Completed {
            id: 7,
            files: vec![file("shared/a.sst", size)],
            deltas: (0..deltas)
                .map(|i| file(&format!("deltas/{i}"), 1))
                .collect(),
        };
        assert!(may_extend(&last(2, 10), false, true, 4, 100));
        assert!(
            !may_extend(&last(2, 10), true, true, 4, 100),
            "a base asked for"
        );
        assert!(
            !may_extend(&last(2, 10), false, false, 4, 100),
            "not incremental"
        );
        assert!(
            !may_extend(&last(4, 10), false, true, 4, 100),
            "max_deltas reached"
        );
        assert!(
            !may_extend(&last(0, 10), false, true, 0, 100),
            "max_deltas = 0"
        );
        // The chain references 2 x the state's size at most: 198 + 2 deltas = 200.
        assert!(may_extend(&last(2, 198), false, true, 4, 100));
        assert!(!may_extend(&last(2, 199), false, true, 4, 100));
    }

    #[test]
    fn each_log_keeps_what_the_oldest_retained_checkpoint_needs() {
        let offsets = BTreeMap::from([
            (3, BTreeMap::from([(1, 50), (2, 9)])),
            (4, BTreeMap::from([(1, 80), (2, 4), (5, 3)])),
        ]);
        // Table 5 is not in checkpoint 3 (created after it): its whole log stays.
        assert_eq!(
            log_floors(&offsets),
            BTreeMap::from([(1, 50), (2, 4), (5, 0)])
        );
        assert!(log_floors(&BTreeMap::new()).is_empty());
    }

    fn file(object: &str, size: u64) -> FileRef {
        FileRef {
            object: object.into(),
            local: object.rsplit('/').next().unwrap_or_default().into(),
            size,
            crc32: 0,
        }
    }

    fn name(id: u64) -> String {
        format!("checkpoints/{id:020}/manifest.json")
    }

    /// A store holding `objects` and the manifests (a manifest is `Err` where it did not
    /// decode).
    fn store(objects: &[(&str, u64)], manifests: Vec<(u64, Result<Manifest>)>) -> StoreContents {
        let mut all: BTreeMap<String, u64> =
            objects.iter().map(|(n, s)| (n.to_string(), *s)).collect();
        for (id, _) in &manifests {
            all.insert(name(*id), 100);
        }
        StoreContents {
            objects: all,
            manifests: manifests.into_iter().map(|(id, m)| (name(id), m)).collect(),
        }
    }

    #[test]
    fn whole_checkpoints_are_tried_newest_first_and_damaged_ones_say_why() {
        let (a, b) = (file("shared/r-1.sst", 5), file("shared/r-2.sst", 6));
        let mut short = b.clone();
        short.size += 1;
        let mut no_catalog = Manifest::for_tests(6, vec![a.clone()]);
        no_catalog.catalog = serde_json::Value::Null;
        let s = store(
            &[("shared/r-1.sst", 5), ("shared/r-2.sst", 6)],
            vec![
                (1, Ok(Manifest::for_tests(1, vec![a.clone()]))),
                (2, Ok(Manifest::for_tests(2, vec![a.clone(), b.clone()]))),
                (
                    3,
                    Ok(Manifest::for_tests(
                        3,
                        vec![a.clone(), file("shared/r-3.sst", 1)],
                    )),
                ),
                (4, Ok(Manifest::for_tests(4, vec![short]))),
                (
                    5,
                    Err(Error::new(
                        ErrorKind::DataCorruption,
                        "damaged checkpoint manifest",
                    )),
                ),
                (6, Ok(no_catalog)),
            ],
        );
        let plan = recovery_plan(&s).unwrap();
        let ids: Vec<u64> = plan.candidates.iter().map(|m| m.id).collect();
        assert_eq!(ids, [2, 1]);
        let reasons: Vec<(&str, &str)> = (plan.damaged.iter())
            .map(|d| (d.manifest.as_str(), d.reason.as_str()))
            .collect();
        assert_eq!(reasons.len(), 4);
        assert_eq!(reasons[0].0, name(6));
        assert!(
            reasons[0].1.contains("cannot read a checkpoint's catalog"),
            "{reasons:?}"
        );
        assert!(reasons[1].1.contains("damaged checkpoint manifest"));
        assert!(reasons[2].1.contains("has 6 bytes, the manifest says 7"));
        assert!(reasons[3].1.contains("shared/r-3.sst is missing"));
        assert!(recovery_plan(&StoreContents::default())
            .unwrap()
            .candidates
            .is_empty());
    }

    #[test]
    fn a_checkpoint_of_a_newer_version_refuses_the_start_instead_of_an_older_restore() {
        let a = file("shared/r-1.sst", 5);
        let newer_manifest = Error::not_supported("checkpoint manifest of format 99");
        let mut newer_catalog = Manifest::for_tests(2, vec![a.clone()]);
        newer_catalog.catalog = serde_json::json!({"format": 99, "objects": []});
        for newest in [Err(newer_manifest), Ok(newer_catalog)] {
            let s = store(
                &[("shared/r-1.sst", 5)],
                vec![
                    (1, Ok(Manifest::for_tests(1, vec![a.clone()]))),
                    (2, newest),
                ],
            );
            let refused = recovery_plan(&s).unwrap_err();
            assert_eq!(refused.kind, ErrorKind::NotSupported, "{refused}");
            assert!(refused.message.contains(&name(2)), "{refused}");
        }
    }

    #[test]
    fn without_a_checkpoint_the_start_is_refused_only_when_a_log_was_truncated() {
        assert!(without_checkpoint(&[], None).is_ok());
        let empty = without_checkpoint(&[], Some((1001, 40))).unwrap_err();
        assert_eq!(empty.kind, ErrorKind::DataCorruption);
        assert!(empty
            .message
            .starts_with("the checkpoint store holds no checkpoint"));
        assert!(empty.message.contains("table 1001's starts at record 40"));
        let damaged = [Damaged {
            manifest: name(3),
            reason: "shared/x is missing".into(),
        }];
        assert!(without_checkpoint(&damaged, None).is_ok());
        let e = without_checkpoint(&damaged, Some((1001, 40))).unwrap_err();
        assert!(e.message.contains("shared/x is missing"), "{e}");
    }

    #[test]
    fn the_checkpointer_adopts_what_decoded_and_was_not_found_damaged() {
        let s = store(
            &[],
            vec![
                (1, Ok(Manifest::for_tests(1, vec![]))),
                (2, Ok(Manifest::for_tests(2, vec![]))),
                (3, Err(Error::new(ErrorKind::DataCorruption, "undecodable"))),
            ],
        );
        let damaged = [Damaged {
            manifest: name(2),
            reason: "a file's bytes differ".into(),
        }];
        let (usable, unusable) = adopted(&s, &damaged);
        assert_eq!(usable.iter().map(|m| m.id).collect::<Vec<_>>(), [1]);
        let left: Vec<(&str, Option<u64>, &str)> = (unusable.iter())
            .map(|(n, m, why)| (*n, m.map(|m| m.id), why.as_str()))
            .collect();
        let (two, three) = (name(2), name(3));
        assert_eq!(
            left,
            [
                (two.as_str(), Some(2), "a file's bytes differ"),
                (three.as_str(), None, "undecodable")
            ]
        );
    }

    #[test]
    fn orphans_are_what_no_manifest_names_unless_a_manifest_is_unreadable() {
        let base = Manifest::for_tests(1, vec![file("checkpoints/00000000000000000001/a.sst", 1)]);
        let mut delta =
            Manifest::for_tests(2, vec![file("checkpoints/00000000000000000001/a.sst", 1)]);
        delta.deltas = vec![file("shared/r-d1.sst", 1)];
        let objects = [
            ("checkpoints/00000000000000000001/a.sst", 1),
            ("checkpoints/00000000000000000009/b.sst", 1),
            ("shared/r-d1.sst", 1),
            ("shared/r-lost.sst", 1),
            ("generations/0001", 1),
        ];
        // Checkpoint 1's manifest expired, but delta 2 still names its base's file.
        let mut s = store(&objects, vec![(2, Ok(delta.clone()))]);
        s.objects.remove(&name(1));
        let found = orphans(&s, &[&s.manifests[0].1.as_ref().unwrap().clone()]);
        assert_eq!(
            found,
            [
                "checkpoints/00000000000000000009/b.sst",
                "shared/r-lost.sst"
            ]
        );
        // An unreadable manifest may name anything: nothing goes.
        let s = store(
            &objects,
            vec![
                (1, Ok(base)),
                (2, Err(Error::new(ErrorKind::DataCorruption, "bad"))),
            ],
        );
        let readable: Vec<&Manifest> = s
            .manifests
            .iter()
            .filter_map(|(_, m)| m.as_ref().ok())
            .collect();
        assert!(orphans(&s, &readable).is_empty());
    }
}
