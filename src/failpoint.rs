//! Failpoints: named places in the checkpoint, table and recovery paths where a test can make
//! the process die, as a `kill -9` would, at exactly that instant; places where an actor
//! can be made to fail; and places in async code where the process can be held, so that a
//! test stops it there with the signal of its choice.
//!
//! `WEIR_FAILPOINTS=name[@n][:action][,name[@n][:action]...]` arms each named point at its
//! `n`-th hit (first when no `@n`): `hit(name)` and `reach(name)` abort the process there,
//! `fails(name)` answers true there (the caller then fails as a bug would, for tests of what
//! survives a broken actor). A point armed with `:pause` makes `reach(name)` wait there for
//! ever instead of aborting (`hit` and `fails` ignore it). A point armed with `:stall` makes
//! `stall(name)` block its thread for `STALL` at that hit and every later one, as a slow disk
//! would. A point armed with `:enospc`, `:emfile` or `:eio` makes `io(name)` fail with that
//! error, as the disk or the process's descriptor table would; `@n..m` arms it from the
//! `n`-th hit to the `m`-th (space coming back after), `@n` at that hit only. Only debug
//! builds (what tests run)
//! read the variable; in release builds all of them are empty and compile away. The names
//! are listed in `docs/design/0004-recovery.md`.

/// Aborts the process if the failpoint `name` is armed and this is its chosen hit.
#[inline(always)]
pub fn hit(name: &str) {
    if fails(name) {
        abort(name);
    }
}

/// Like `hit`, for async code: a point armed with `:pause` holds the task here for ever.
#[inline(always)]
pub async fn reach(name: &str) {
    #[cfg(debug_assertions)]
    match armed::reached(name, |a| {
        matches!(a, armed::Action::Abort | armed::Action::Pause)
    }) {
        Some(armed::Action::Abort) => abort(name),
        Some(armed::Action::Pause) => {
            eprintln!("failpoint {name}: paused");
            std::future::pending::<()>().await;
        }
        // Stalls are for `stall`, errors for `io`.
        Some(armed::Action::Stall | armed::Action::Io(_)) | None => {}
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}

/// How long a stalled failpoint blocks its thread.
pub const STALL: std::time::Duration = std::time::Duration::from_secs(5);

/// Blocks the thread for [`STALL`] if the failpoint `name` is armed with `:stall` and this is
/// its chosen hit or a later one.
#[inline(always)]
pub fn stall(name: &str) {
    #[cfg(debug_assertions)]
    if armed::reached(name, |a| a == armed::Action::Stall).is_some() {
        eprintln!("failpoint {name}: stalling");
        std::thread::sleep(STALL);
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}

/// Fails with the error the failpoint `name` is armed with (`:enospc`, `:emfile`, `:eio`) if
/// this is one of its chosen hits.
#[inline(always)]
pub fn io(name: &str) -> std::io::Result<()> {
    #[cfg(debug_assertions)]
    if let Some(armed::Action::Io(errno)) =
        armed::reached(name, |a| matches!(a, armed::Action::Io(_)))
    {
        eprintln!("failpoint {name}: failing with errno {errno}");
        return Err(std::io::Error::from_raw_os_error(errno));
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
    Ok(())
}

/// Whether the failpoint `name` is armed (to abort) and this is its chosen hit.
#[inline(always)]
pub fn fails(name: &str) -> bool {
    #[cfg(debug_assertions)]
    return armed::reached(name, |a| a == armed::Action::Abort).is_some();
    #[cfg(not(debug_assertions))]
    {
        let _ = name;
        false
    }
}

fn abort(name: &str) -> ! {
    // Straight to stderr: the log's writer may buffer, and nothing after this runs.
    eprintln!("failpoint {name}: aborting the process");
    std::process::abort();
}

#[cfg(debug_assertions)]
mod armed {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Action {
        Abort,
        Pause,
        Stall,
        /// Fail an I/O operation with this `errno`.
        Io(i32),
    }

    pub struct Armed {
        /// The hit that fires (the first of them, for stalls and I/O errors).
        pub at: u64,
        /// The last hit that fails with an I/O error.
        pub until: u64,
        pub action: Action,
        hits: AtomicU64,
    }

    static ARMED: OnceLock<HashMap<String, Armed>> = OnceLock::new();

    /// The action of the failpoint `name` if it is armed with an action the caller takes
    /// (`takes`) and this is its chosen hit. Only such calls count as hits, so that a point
    /// where a stall and an I/O error can both be injected counts each kind's calls alone.
    pub fn reached(name: &str, takes: impl Fn(Action) -> bool) -> Option<Action> {
        let armed =
            ARMED.get_or_init(|| parse(&std::env::var("WEIR_FAILPOINTS").unwrap_or_default()));
        let point = armed.get(name).filter(|p| takes(p.action))?;
        let hit = point.hits.fetch_add(1, Ordering::SeqCst) + 1;
        let fires = match point.action {
            Action::Stall => hit >= point.at,
            Action::Io(_) => (point.at..=point.until).contains(&hit),
            Action::Abort | Action::Pause => hit == point.at,
        };
        fires.then_some(point.action)
    }

    pub(super) fn parse(spec: &str) -> HashMap<String, Armed> {
        spec.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                let (s, action) = match s.rsplit_once(':') {
                    Some((s, "pause")) => (s, Action::Pause),
                    Some((s, "stall")) => (s, Action::Stall),
                    Some((s, "enospc")) => (s, Action::Io(libc::ENOSPC)),
                    Some((s, "emfile")) => (s, Action::Io(libc::EMFILE)),
                    Some((s, "eio")) => (s, Action::Io(libc::EIO)),
                    _ => (s, Action::Abort),
                };
                let (name, at, until) = match s.split_once('@') {
                    Some((name, hits)) => {
                        let hit = |n: &str| n.parse().unwrap_or(1).max(1);
                        match hits.split_once("..") {
                            Some((from, to)) => (name, hit(from), hit(to)),
                            None => (name, hit(hits), hit(hits)),
                        }
                    }
                    None => (s, 1, 1),
                };
                let armed = Armed {
                    at,
                    until,
                    action,
                    hits: AtomicU64::new(0),
                };
                (name.to_string(), armed)
            })
            .collect()
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::armed::Action;

    #[test]
    fn specs_name_points_hits_and_actions() {
        let armed = super::armed::parse(
            " checkpoint.before_manifest , recovery.before_swap@3,checkpoint.before_upload@2:pause,changelog.sync:stall,changelog.write@2..4:enospc",
        );
        assert_eq!(armed.len(), 5);
        assert_eq!(armed["changelog.write"].action, Action::Io(libc::ENOSPC));
        assert_eq!(
            (armed["changelog.write"].at, armed["changelog.write"].until),
            (2, 4)
        );
        assert_eq!(armed["changelog.sync"].action, Action::Stall);
        assert_eq!(armed["checkpoint.before_manifest"].at, 1);
        assert_eq!(armed["checkpoint.before_manifest"].action, Action::Abort);
        assert_eq!(armed["recovery.before_swap"].at, 3);
        assert_eq!(armed["checkpoint.before_upload"].at, 2);
        assert_eq!(armed["checkpoint.before_upload"].action, Action::Pause);
        assert!(super::armed::parse("").is_empty());
    }
}
