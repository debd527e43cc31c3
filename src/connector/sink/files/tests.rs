//! The file sink's delivery against a local directory: files, their partitions, and a
//! delivery decided before a crash finished by the next `delivered`.

use super::*;
use crate::stream::test_util::{chunk, schema};
use datafusion::arrow::datatypes::DataType;

fn config(dir: &std::path::Path, encode: Encode, partition_by: Vec<usize>) -> Config {
    Config {
        connector: "file",
        sink: "s/1".into(),
        path: dir.display().to_string(),
        s3: Vec::new(),
        encode,
        partition_by: partition_by.clone(),
        header: true,
        file_columns: (0..2).filter(|c| !partition_by.contains(c)).collect(),
    }
}

/// Every file under `dir` (not Weir's own), with its contents.
fn files(dir: &std::path::Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let name = p.strip_prefix(dir).unwrap().display().to_string();
            if name.starts_with("_weir") {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(name, std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    out
}

#[tokio::test]
async fn a_delivery_writes_one_file_per_partition_named_after_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let s = schema(&[("day", DataType::Utf8), ("v", DataType::Int64)]);
    let mut w = Writer::new(config(dir.path(), Encode::Csv, vec![0]), &s).unwrap();
    assert_eq!(w.delivered().await.unwrap(), None);
    w.begin(7, false).await.unwrap();
    // The delete is dropped (force_append_only); "a/b" is escaped.
    w.write(chunk(&s, "+ mon 1\n+ tue 2\n- mon 1\n+ mon 3"))
        .await
        .unwrap();
    w.write(chunk(&s, "+ a/b 4")).await.unwrap();
    w.commit(7).await.unwrap();
    let got = files(dir.path());
    let want: BTreeMap<String, String> = [
        // Numbered in the order they close: at the commit, by directory.
        ("day=a%2Fb/part-00000000000000000007-00000.csv", "v\n4\n"),
        ("day=mon/part-00000000000000000007-00001.csv", "v\n1\n3\n"),
        ("day=tue/part-00000000000000000007-00002.csv", "v\n2\n"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(got, want);
    // Nothing temporary is left, and the marker says 7.
    assert_eq!(w.delivered().await.unwrap(), Some(7));
    assert!(std::fs::read_dir(dir.path().join("_weir/s%2F1/tmp"))
        .map(|d| d.count() == 0)
        .unwrap_or(true));
}

#[tokio::test]
async fn a_decided_delivery_is_finished_after_a_crash_and_an_undecided_one_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = schema(&[("k", DataType::Utf8), ("v", DataType::Int64)]);
    let mut w = Writer::new(config(dir.path(), Encode::Json, vec![]), &s).unwrap();
    w.begin(3, false).await.unwrap();
    w.write(chunk(&s, "+ a 1\n+ b 2")).await.unwrap();
    // Decided (the commit record written), then the process stops.
    w.decide(3).await.unwrap();
    assert!(
        files(dir.path()).is_empty(),
        "nothing is visible before it is published"
    );
    let mut after = Writer::new(config(dir.path(), Encode::Json, vec![]), &s).unwrap();
    assert_eq!(after.delivered().await.unwrap(), Some(3));
    let got = files(dir.path());
    assert_eq!(
        got.get("part-00000000000000000003-00000.json")
            .map(String::as_str),
        Some("{\"k\":\"a\",\"v\":1}\n{\"k\":\"b\",\"v\":2}\n")
    );
    // A delivery cut short before its record: its temporary file is deleted when the next
    // one begins, and the next one's files take the epoch it delivers.
    after.begin(5, false).await.unwrap();
    after.write(chunk(&s, "+ c 3")).await.unwrap();
    after.close("").await.unwrap();
    let mut again = Writer::new(config(dir.path(), Encode::Json, vec![]), &s).unwrap();
    assert_eq!(again.delivered().await.unwrap(), Some(3));
    again.begin(6, false).await.unwrap();
    assert_eq!(
        std::fs::read_dir(dir.path().join("_weir/s%2F1/tmp"))
            .unwrap()
            .count(),
        0
    );
    again.write(chunk(&s, "+ c 3\n+ d 4")).await.unwrap();
    again.commit(6).await.unwrap();
    let got = files(dir.path());
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.contains_key("part-00000000000000000006-00000.json"));
}

#[test]
fn partition_values_are_escaped_as_hive_does() {
    assert_eq!(escape(b"2026-12-01", true), "2026-12-01");
    assert_eq!(escape(b"a/b=c:d%", true), "a%2Fb%3Dc%3Ad%25");
    assert_eq!(escape(b"1.5", true), "1.5");
    assert_eq!(escape(b"..", false), "%2E%2E");
    assert_eq!(escape("é".as_bytes(), true), "%C3%A9");
}

#[tokio::test]
async fn a_sink_built_again_replaces_the_files_it_wrote_before() {
    let dir = tempfile::tempdir().unwrap();
    let s = schema(&[("k", DataType::Utf8), ("v", DataType::Int64)]);
    let mut w = Writer::new(config(dir.path(), Encode::Json, vec![]), &s).unwrap();
    w.begin(3, false).await.unwrap();
    w.write(chunk(&s, "+ a 1\n+ b 2")).await.unwrap();
    w.commit(3).await.unwrap();
    // Someone else's file, of another encoding, stays.
    std::fs::write(dir.path().join("notes.csv"), "x\n").unwrap();
    // Built again: the view's rows come anew, in place of the earlier files.
    w.begin(8, true).await.unwrap();
    w.write(chunk(&s, "+ a 1\n+ b 3")).await.unwrap();
    w.commit(8).await.unwrap();
    let got = files(dir.path());
    let names: Vec<&str> = got.keys().map(String::as_str).collect();
    assert_eq!(names, ["notes.csv", "part-00000000000000000008-00000.json"]);
}
