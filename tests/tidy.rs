//! Checks of the source tree itself: each outside system has one owning module, and every
//! file says what it is for.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable source directory") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(root)
                .expect("under root")
                .display()
                .to_string();
            (rel, std::fs::read_to_string(&p).expect("readable file"))
        })
        .collect()
}

/// The files outside `owners` with a line of code (not a comment) that `names` matches.
fn named_outside(owners: &[&str], names: impl Fn(&str) -> bool) -> Vec<String> {
    sources()
        .into_iter()
        .filter(|(path, text)| {
            !owners.iter().any(|o| path.starts_with(o))
                && text.lines().any(|l| {
                    let l = l.trim_start();
                    !l.starts_with("//") && names(l)
                })
        })
        .map(|(path, _)| path)
        .collect()
}

/// `crate` may only be named in files under `owner`.
fn only_owner_uses(crate_name: &str, owner: &str) {
    let offenders = named_outside(&[owner], |l| {
        l.contains(&format!("{crate_name}::")) || l.starts_with(&format!("use {crate_name}"))
    });
    assert!(
        offenders.is_empty(),
        "only {owner} may use {crate_name}, but these do: {offenders:?}"
    );
}

/// The server reads the time through `clock.rs` alone, so that tests can control it (the
/// testers under `src/bin/` are programs of their own).
#[test]
fn only_clock_reads_the_time() {
    let offenders = named_outside(&["src/clock.rs", "src/bin/"], |l| {
        ["Instant::now", "SystemTime::now", "Utc::now", "Local::now"]
            .iter()
            .any(|n| l.contains(n))
    });
    assert!(
        offenders.is_empty(),
        "only src/clock.rs may read the time, but these do: {offenders:?}"
    );
}

#[test]
fn only_server_uses_pgwire() {
    only_owner_uses("pgwire", "src/server/");
}

#[test]
fn only_state_uses_rocksdb() {
    only_owner_uses("rocksdb", "src/state/");
}

#[test]
fn only_checkpoint_uses_the_object_store() {
    only_owner_uses("object_store", "src/checkpoint/");
}

#[test]
fn every_file_opens_with_a_doc_line() {
    let missing: Vec<String> = sources()
        .into_iter()
        .filter(|(_, text)| !text.starts_with("//!"))
        .map(|(path, _)| path)
        .collect();
    assert!(missing.is_empty(), "files without a //! line: {missing:?}");
}
