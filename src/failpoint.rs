//! Failpoints: named places in the checkpoint and recovery paths where a test can make the
//! process die, as a `kill -9` would, at exactly that instant.
//!
//! `WEIR_FAILPOINTS=name[@n][,name[@n]...]` aborts the process the `n`-th time (first when no
//! `@n`) execution reaches `hit(name)`. Only debug builds (what tests run) read the variable;
//! in release builds `hit` is empty and compiles away. The names are listed in
//! `docs/design/0004-recovery.md`.

/// Aborts the process if the failpoint `name` is armed and this is its chosen hit.
#[inline(always)]
pub fn hit(name: &str) {
    #[cfg(debug_assertions)]
    armed::hit(name);
    #[cfg(not(debug_assertions))]
    let _ = name;
}

#[cfg(debug_assertions)]
mod armed {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    /// Each armed failpoint: the hit that aborts, and how many hits so far.
    static ARMED: OnceLock<HashMap<String, (u64, AtomicU64)>> = OnceLock::new();

    pub fn hit(name: &str) {
        let armed =
            ARMED.get_or_init(|| parse(&std::env::var("WEIR_FAILPOINTS").unwrap_or_default()));
        let Some((at, hits)) = armed.get(name) else {
            return;
        };
        if hits.fetch_add(1, Ordering::SeqCst) + 1 == *at {
            // Straight to stderr: the log's writer may buffer, and nothing after this runs.
            eprintln!("failpoint {name}: aborting the process");
            std::process::abort();
        }
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
