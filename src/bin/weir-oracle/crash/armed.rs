//! What each round of the crash test arms before the server starts: the next failpoint, or an
//! injected I/O error of the change log, catalog or state store, every other round. A run
//! arms every one of them, whatever its number of kills, and fails if one that must be
//! reached never is.

use std::collections::{BTreeMap, BTreeSet};

use weir::rng::Rng;

/// The failpoints armed in turn, every other round.
const FAILPOINTS: &[&str] = &[
    "checkpoint.before_upload",
    "checkpoint.between_uploads",
    "checkpoint.before_manifest",
    "checkpoint.after_manifest",
    "checkpoint.during_expiry",
    "table.after_append",
    "table.log_truncated",
    // A large statement: between its group's records, and between its parts' epochs.
    "changelog.group_part",
    "table.group_part_sent",
    // A block over both tables: after its commit point, and between its two tables' appends.
    "table.after_commit_point",
    "table.commit_appended",
    "recovery.during_download",
    "recovery.before_swap",
    "recovery.between_renames",
    "recovery.after_swap",
    // I/O errors, injected rather than fatal: the writers' statements that meet them are
    // refused (53100, 53000, 58030) and must leave nothing behind, before a kill at random.
    "changelog.write:enospc",
    "changelog.sync:eio",
    "changelog.sync:emfile",
    "changelog.write:enospc+cut_back",
    // The state store's writes (a RocksDB flush or write on a full disk): every actor stops,
    // tables refuse writes (53100) until the restart.
    "state.write:enospc",
    // Checkpoint uploads: the checkpoint fails, nothing else does.
    "checkpoint.put:eio",
    // Catalog saves: the round's DDL is refused (53100) and leaves nothing behind.
    "catalog.save:enospc",
    // Sinks: after a delivery's writes, before the target's commit (the checkpoint's manifest
    // is durable by then), and after that commit (delivered again only if the target's
    // progress row were ignored); after the Kafka messages, before the marker (sent again); after a
    // file delivery's commit record, and after its files' renames (finished at start).
    "sink.postgres.before_commit",
    "sink.postgres.after_commit",
    "sink.kafka.before_marker",
    "sink.file.before_publish",
    "sink.file.before_marker",
];

/// How many rounds a failpoint is armed before a run that never reached it fails.
const TRIES: u32 = 3;

/// Failpoints a run may arm without reaching, each with why. (None today: every entry of
/// `FAILPOINTS` is on a path the crash test's writers take in every round.)
const CONDITIONAL: &[(&str, &str)] = &[];

/// Which failpoint an armed round takes, and which have been reached: each in turn for a
/// first pass over `FAILPOINTS`, then those armed but not reached yet (up to `TRIES` rounds
/// each), then each in turn again.
pub(super) struct Arming {
    /// `FAILPOINTS` (another list in unit tests).
    all: &'static [&'static str],
    /// `CONDITIONAL`'s names.
    conditional: Vec<&'static str>,
    /// Armed rounds so far.
    armed: usize,
    tries: BTreeMap<&'static str, u32>,
    reached: BTreeSet<&'static str>,
}

impl Default for Arming {
    fn default() -> Arming {
        Arming::new(FAILPOINTS, CONDITIONAL)
    }
}

impl Arming {
    fn new(all: &'static [&'static str], conditional: &[(&'static str, &str)]) -> Arming {
        Arming {
            all,
            conditional: conditional.iter().map(|(name, _)| *name).collect(),
            armed: 0,
            tries: BTreeMap::new(),
            reached: BTreeSet::new(),
        }
    }

    fn next(&mut self) -> &'static str {
        let name = match self.armed < self.all.len() {
            true => self.all[self.armed],
            false => self
                .to_retry()
                .unwrap_or(self.all[self.armed % self.all.len()]),
        };
        self.armed += 1;
        *self.tries.entry(name).or_default() += 1;
        name
    }

    /// A failpoint that must be reached, was not, and has tries left.
    fn to_retry(&self) -> Option<&'static str> {
        self.all.iter().copied().find(|name| {
            !self.reached.contains(name)
                && !self.conditional.contains(name)
                && self.tries.get(name).copied().unwrap_or(0) < TRIES
        })
    }

    /// Records that the server reached `name` (a failpoint that aborted it, or an I/O error it
    /// met).
    pub(super) fn reached(&mut self, name: &'static str) {
        self.reached.insert(name);
    }

    /// Whether every failpoint has been armed, and each that must be reached was reached or
    /// armed `TRIES` times: the run goes on until then, past its kills if need be.
    pub(super) fn settled(&self) -> bool {
        self.armed >= self.all.len() && self.to_retry().is_none()
    }

    /// The failpoints that must be reached and were armed without being reached.
    pub(super) fn unreached(&self) -> Vec<String> {
        self.tries
            .iter()
            .filter(|(name, _)| !self.reached.contains(*name) && !self.conditional.contains(name))
            .map(|(name, tries)| format!("{name} (armed {tries} times)"))
            .collect()
    }
}

/// The failpoint an I/O fault of `FAILPOINTS` is injected at (`changelog.write` for
/// `changelog.write:enospc+cut_back`).
pub(super) fn fault_point(fault: &str) -> &str {
    fault.split_once(':').map_or(fault, |(point, _)| point)
}

/// The `WEIR_FAILPOINTS` value that injects the I/O error named `fault` (an entry of
/// `FAILPOINTS` with a `:`) from its `at`-th hit on, for a few hits.
fn io_fault_spec(fault: &str, at: u64) -> String {
    let point = fault_point(fault);
    let kind = fault.split_once(':').map_or("eio", |(_, kind)| kind);
    let until = at + 3;
    match kind.split_once('+') {
        // A failed write whose cut-back fails too: the next append cuts back first.
        Some((kind, "cut_back")) => {
            format!("{point}@{at}..{until}:{kind},changelog.cut_back@1:eio")
        }
        _ => format!("{point}@{at}..{until}:{kind}"),
    }
}

/// What one round arms before the server starts: a failpoint, or an I/O fault of the change
/// log, catalog or state store, and the `WEIR_FAILPOINTS` spec that arms it.
pub(super) struct Armed {
    pub(super) failpoint: Option<&'static str>,
    pub(super) io_fault: Option<&'static str>,
    pub(super) spec: Option<String>,
}

impl Armed {
    /// Every other round arms the next failpoint, at one of its first few hits.
    pub(super) fn for_round(round: u64, rng: &mut Rng, arming: &mut Arming) -> Armed {
        let armed = (round % 2 == 1).then(|| arming.next());
        let io_fault = armed.filter(|name| name.contains(':'));
        let failpoint = armed.filter(|name| !name.contains(':'));
        let spec = match (failpoint, io_fault) {
            // A catalog is saved only by DDL: from its first save on.
            (_, Some(fault)) if fault.starts_with("catalog.") => Some(io_fault_spec(fault, 1)),
            (_, Some(fault)) => Some(io_fault_spec(fault, 1 + rng.below(20))),
            (Some(name), None) => {
                let at = if name.starts_with("recovery.") {
                    1
                } else {
                    1 + rng.below(3)
                };
                Some(format!("{name}@{at}"))
            }
            (None, None) => None,
        };
        Armed {
            failpoint,
            io_fault,
            spec,
        }
    }

    /// The failpoint armed for after the start (recovery's fire during it).
    pub(super) fn after_start(&self) -> Option<&'static str> {
        self.failpoint.filter(|n| !n.starts_with("recovery."))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Arms rounds until the schedule settles, reaching each failpoint `reach` allows.
    fn run(arming: &mut Arming, mut reach: impl FnMut(&str) -> bool) -> Vec<&'static str> {
        let mut armed = Vec::new();
        while !arming.settled() {
            let name = arming.next();
            armed.push(name);
            if reach(name) {
                arming.reached(name);
            }
        }
        armed
    }

    #[test]
    fn every_failpoint_is_armed_and_one_never_reached_fails_the_run() {
        const ALL: &[&str] = &["a", "b", "c"];
        let mut arming = Arming::new(ALL, &[]);
        assert_eq!(run(&mut arming, |_| true), ["a", "b", "c"]);
        assert!(arming.unreached().is_empty());

        // One never reached is armed again, up to TRIES rounds in all, and reported.
        let mut arming = Arming::new(ALL, &[]);
        assert_eq!(run(&mut arming, |n| n != "b"), ["a", "b", "c", "b", "b"]);
        assert_eq!(arming.unreached(), ["b (armed 3 times)"]);

        // Reached on its second try: no failure.
        let mut arming = Arming::new(ALL, &[]);
        let mut tried = 0;
        let armed = run(&mut arming, |n| {
            tried += u32::from(n == "c");
            n != "c" || tried == 2
        });
        assert_eq!(armed, ["a", "b", "c", "c"]);
        assert!(arming.unreached().is_empty());

        // A conditional one is armed in turn, neither retried nor reported.
        let mut arming = Arming::new(ALL, &[("b", "a path the run may not take")]);
        assert_eq!(run(&mut arming, |n| n != "b"), ["a", "b", "c"]);
        assert!(arming.unreached().is_empty());
        // After the first pass, rounds arm each in turn again.
        assert_eq!(
            (0..4).map(|_| arming.next()).collect::<Vec<_>>(),
            ["a", "b", "c", "a"]
        );
    }

    #[test]
    fn the_list_has_every_io_fault_spelled_as_a_point_and_a_kind() {
        for fault in FAILPOINTS.iter().filter(|f| f.contains(':')) {
            let spec = io_fault_spec(fault, 2);
            assert!(
                spec.starts_with(&format!("{}@2..5:", fault_point(fault))),
                "{spec}"
            );
        }
        assert!(CONDITIONAL
            .iter()
            .all(|(name, why)| FAILPOINTS.contains(name) && !why.is_empty()));
    }
}
