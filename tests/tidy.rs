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

/// Checkpoints write to object stores; files sources read from one and file sinks write to
/// one (`connector = 's3'`), through what `connector/objects.rs` opens.
#[test]
fn only_checkpoints_and_files_connectors_use_the_object_store() {
    let owners = [
        "src/checkpoint/",
        "src/connector/objects.rs",
        "src/connector/source/files/",
        "src/connector/sink/files",
    ];
    let offenders = named_outside(&owners, |l| {
        l.contains("object_store::") || l.starts_with("use object_store")
    });
    assert!(
        offenders.is_empty(),
        "only {owners:?} may use object_store, but these do: {offenders:?}"
    );
}

/// The server's Kafka client is its connectors'; the crash test (`weir-oracle`) produces to its
/// test broker as a client of its own, as `tests/kafka.rs` does.
#[test]
fn only_connectors_use_the_kafka_client() {
    let offenders = named_outside(&["src/connector/", "src/bin/weir-oracle/"], |l| {
        l.contains("rdkafka::") || l.starts_with("use rdkafka")
    });
    assert!(
        offenders.is_empty(),
        "only src/connector/ may use rdkafka, but these do: {offenders:?}"
    );
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

/// A production function is at most this many lines long.
const FUNCTION_LINES_MAX: usize = 120;

/// A file holds at most this many lines of production code (before its `#[cfg(test)]` module).
const FILE_LINES_MAX: usize = 800;

/// The crate's modules `src/db/` may import, at most.
const DB_IMPORTS_MAX: usize = 9;

/// A file's production lines: those before a `#[cfg(test)]` module written inline (a test
/// module in a file of its own, `mod tests;`, ends nothing).
fn production(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let end = (0..lines.len())
        .find(|&i| {
            lines[i].trim() == "#[cfg(test)]"
                && lines.get(i + 1).is_some_and(|l| {
                    l.trim_start().starts_with("mod ") && l.trim_end().ends_with('{')
                })
        })
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

/// Each function with a body in `lines` (formatted by rustfmt: its body ends at the first
/// `}` at the indentation of its `fn`), as its name and length in lines.
fn functions(lines: &[&str]) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let code = line.trim_start();
        let indent = &line[..line.len() - code.len()];
        let after_fn = code
            .split_once("fn ")
            .filter(|(before, _)| {
                before.split_whitespace().all(|w| {
                    w.starts_with("pub")
                        || ["async", "const", "unsafe", "extern", "\"C\""].contains(&w)
                })
            })
            .map(|(_, rest)| rest);
        let Some(rest) = after_fn else {
            i += 1;
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // The signature runs on to its body's `{`, or ends with `;` (a declaration).
        let mut open = i;
        while open < lines.len() && !lines[open].contains('{') && !lines[open].ends_with(';') {
            open += 1;
        }
        if open == lines.len() || !lines[open].contains('{') {
            i = open + 1;
            continue;
        }
        let closing = format!("{indent}}}");
        match (open..lines.len())
            .find(|&k| lines[k] == closing || (k == open && lines[k].trim_end().ends_with('}')))
        {
            Some(end) => {
                found.push((name, end - i + 1));
                i = end + 1;
            }
            None => i += 1,
        }
    }
    found
}

#[test]
fn functions_and_files_stay_within_their_size_limits() {
    let mut problems = Vec::new();
    for (path, text) in sources() {
        if path.ends_with("/tests.rs") {
            continue;
        }
        let lines = production(&text);
        if lines.len() > FILE_LINES_MAX {
            problems.push(format!(
                "{path} has {} production lines, over {FILE_LINES_MAX}: split it",
                lines.len()
            ));
        }
        for (name, length) in functions(&lines) {
            if length > FUNCTION_LINES_MAX {
                problems.push(format!(
                    "{path}: fn {name} has {length} lines, over {FUNCTION_LINES_MAX}: split it"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The crate's modules that the files under `dir` name (`crate::<module>`), sorted.
fn imports_of(dir: &str) -> Vec<String> {
    let mut modules: Vec<String> = sources()
        .into_iter()
        .filter(|(path, _)| path.starts_with(dir))
        .flat_map(|(_, text)| {
            text.split("crate::")
                .skip(1)
                .map(|rest| {
                    rest.chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect::<String>()
                })
                .filter(|m| !m.is_empty())
                .collect::<Vec<_>>()
        })
        .collect();
    modules.sort();
    modules.dedup();
    modules
}

/// The dataflow runs what it is given: it knows neither the planner that built its operators,
/// the connectors behind its sources (a source's history reaches it through a trait), the
/// catalog, nor the database that drives it.
#[test]
fn the_dataflow_imports_neither_planner_connectors_catalog_nor_database() {
    let imports = imports_of("src/stream/");
    let above = [
        "sql",
        "connector",
        "catalog",
        "db",
        "server",
        "table",
        "checkpoint",
    ];
    let named: Vec<&String> = imports
        .iter()
        .filter(|m| above.contains(&m.as_str()))
        .collect();
    assert!(named.is_empty(), "src/stream/ imports {named:?}");
}

#[test]
fn the_database_imports_few_of_the_crates_modules() {
    let modules = imports_of("src/db/");
    assert!(
        modules.len() <= DB_IMPORTS_MAX,
        "src/db/ imports {} of the crate's modules, more than {DB_IMPORTS_MAX}: {modules:?}",
        modules.len()
    );
}

/// Outside the dataflow, operators are known by their specs (`stream::spec`) and a
/// relation's rows through `stream::relation`: the planner builds plans from specs, and no
/// module but `stream/` reaches into an operator's file.
#[test]
fn only_the_dataflow_names_its_operators() {
    let named: Vec<String> = sources()
        .into_iter()
        .filter(|(path, _)| !path.starts_with("src/stream/"))
        .filter(|(_, text)| text.contains("stream::operators"))
        .map(|(path, _)| path)
        .collect();
    assert!(
        named.is_empty(),
        "{named:?} name stream::operators; use stream::spec or stream::relation"
    );
}

/// A module's face is its `mod.rs`: the names it re-exports, and the few submodules it opens
/// whole because their names read with them (`sql::dml::rows`, `stream::spec::JoinSpec`).
/// Opening another is a decision about the module's face: make it here.
#[test]
fn modules_open_only_the_submodules_of_their_face() {
    let open: &[(&str, &[&str])] = &[
        ("catalog", &[]),
        ("changelog", &[]),
        ("checkpoint", &["logs", "plan", "restore"]),
        ("connector", &["sink", "source"]),
        ("db", &[]),
        ("server", &[]),
        ("session", &[]),
        ("sql", &["dml", "rows"]),
        ("state", &[]),
        ("stream", &["graph", "relation", "spec", "test_util"]),
        ("table", &[]),
    ];
    let sources = sources();
    let mut problems = Vec::new();
    let mut directories: Vec<String> = sources
        .iter()
        .filter_map(|(path, _)| path.strip_prefix("src/")?.strip_suffix("/mod.rs"))
        .filter(|module| !module.contains('/'))
        .map(str::to_string)
        .collect();
    directories.sort();
    let listed: Vec<&str> = open.iter().map(|(module, _)| *module).collect();
    if directories != listed {
        problems.push(format!(
            "modules with a mod.rs: {directories:?}, listed: {listed:?}"
        ));
    }
    for (module, expected) in open {
        let path = format!("src/{module}/mod.rs");
        let Some((_, text)) = sources.iter().find(|(p, _)| *p == path) else {
            continue;
        };
        let mut opened: Vec<&str> = production(text)
            .iter()
            .filter_map(|line| line.strip_prefix("pub mod "))
            .map(|rest| rest.trim_end_matches([';', '{', ' ']))
            .collect();
        opened.sort();
        if opened != *expected {
            problems.push(format!(
                "{path} opens {opened:?}, its face lists {expected:?}"
            ));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}
