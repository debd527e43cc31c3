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

/// `crate` may only be named in files under `owner`.
fn only_owner_uses(crate_name: &str, owner: &str) {
    let offenders: Vec<String> = sources()
        .into_iter()
        .filter(|(path, text)| {
            !path.starts_with(owner)
                && text.lines().any(|l| {
                    let l = l.trim_start();
                    !l.starts_with("//")
                        && (l.contains(&format!("{crate_name}::"))
                            || l.starts_with(&format!("use {crate_name}")))
                })
        })
        .map(|(path, _)| path)
        .collect();
    assert!(
        offenders.is_empty(),
        "only {owner} may use {crate_name}, but these do: {offenders:?}"
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
