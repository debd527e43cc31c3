//! Failpoints: named places in the checkpoint, table and recovery paths where a test can make
//! the process die, as a `kill -9` would, at exactly that instant; and places where an actor
//! can be made to fail.
//!
//! `WEIR_FAILPOINTS=name[@n][,name[@n]...]` arms each named point at its `n`-th hit (first
//! when no `@n`): `hit(name)` aborts the process there, `fails(name)` answers true there (the
//! caller then fails as a bug would, for tests of what survives a broken actor). Only debug
//! builds (what tests run) read the variable; in release builds both are empty and compile
//! away. The names are listed in `docs/design/0004-recovery.md`.

/// Aborts the process if the failpoint `name` is armed and this is its chosen hit.
#[inline(always)]
pub fn hit(name: &str) {
    if fails(name) {
        // Straight to stderr: the log's writer may buffer, and nothing after this runs.
        eprintln!("failpoint {name}: aborting the process");
        std::process::abort();
    }
}

/// Whether the failpoint `name` is armed and this is its chosen hit.
#[inline(always)]
pub fn fails(name: &str) -> bool {
    #[cfg(debug_assertions)]
    return armed::reached(name);
    #[cfg(not(debug_assertions))]
    {
        let _ = name;
        false
    }
}

#[cfg(debug_assertions)]
mod armed {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    /// Each armed failpoint: the hit that fires, and how many hits so far.
    static ARMED: OnceLock<HashMap<String, (u64, AtomicU64)>> = OnceLock::new();

    pub fn reached(name: &str) -> bool {
        let armed =
            ARMED.get_or_init(|| parse(&std::env::var("WEIR_FAILPOINTS").unwrap_or_default()));
        let Some((at, hits)) = armed.get(name) else {
            return false;
        };
        hits.fetch_add(1, Ordering::SeqCst) + 1 == *at
    }

    pub(super) fn parse(spec: &str) -> HashMap<String, (u64, AtomicU64)> {
        spec.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| match s.split_once('@') {
                Some((name, n)) => (name.to_string(), n.parse().unwrap_or(1).max(1)),
                None => (s.to_string(), 1),
            })
            .map(|(name, at)| (name, (at, AtomicU64::new(0))))
            .collect()
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    #[test]
    fn specs_name_points_and_hits() {
        let armed = super::armed::parse(" checkpoint.before_manifest , recovery.before_swap@3,");
        assert_eq!(armed.len(), 2);
        assert_eq!(armed["checkpoint.before_manifest"].0, 1);
        assert_eq!(armed["recovery.before_swap"].0, 3);
        assert!(super::armed::parse("").is_empty());
    }
}
