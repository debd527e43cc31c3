//! What each round of the crash test arms before the server starts: the next failpoint, or an
//! injected I/O error of the change log, catalog or state store, every other round.

use weir::rng::Rng;

/// The failpoints armed in turn, every other kill.
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
    // is durable by then); after the Kafka messages, before the marker (sent again); after a
    // file delivery's commit record, and after its files' renames (finished at start).
    "sink.postgres.before_commit",
    "sink.kafka.before_marker",
    "sink.file.before_publish",
    "sink.file.before_marker",
];

/// The `WEIR_FAILPOINTS` value that injects the I/O error named `fault` (an entry of
/// `FAILPOINTS` with a `:`) from its `at`-th hit on, for a few hits.
fn io_fault_spec(fault: &str, at: u64) -> String {
    let (point, kind) = fault.split_once(':').unwrap_or((fault, "eio"));
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
    pub(super) fn for_round(round: u64, rng: &mut Rng) -> Armed {
        let armed = (round % 2 == 1).then(|| FAILPOINTS[(round as usize / 2) % FAILPOINTS.len()]);
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
