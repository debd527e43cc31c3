//! Data directories and checkpoint stores written by earlier versions of Weir restore. Each
//! fixture (`tests/fixtures/<version>-<commit>/`, made by `tests/fixtures/make` with that
//! version's binary, see its README) holds a data directory whose server was killed, and what
//! that server answered for every relation when it was killed and at its last checkpoint. A
//! restart on the data directory must answer the first, a restore from its checkpoint store
//! alone the second; then the views must stay equal to their queries through new changes, a
//! checkpoint of the new server and another kill.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::{text_rows, ChildServer};

const SIGKILL: i32 = 9;

/// The modification time the fixtures give their input files (`INPUT_MTIME` in
/// `tests/fixtures/make`): a file source records it, and refuses a file whose time changed.
const INPUT_MTIME_S: u64 = 1_764_547_200;

/// Rows a server answered, under the queries that return them.
struct Section {
    /// `SELECT * FROM <relation> ORDER BY ...`, then for a view its own query run as a batch
    /// query.
    queries: Vec<String>,
    rows: Vec<String>,
}

fn sections(path: &Path) -> Vec<Section> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut all: Vec<Section> = Vec::new();
    for line in text.lines() {
        if let Some(query) = line.strip_prefix("# ") {
            all.push(Section {
                queries: vec![query.to_string()],
                rows: Vec::new(),
            });
        } else if let Some(query) = line.strip_prefix("= ") {
            all.last_mut().unwrap().queries.push(query.to_string());
        } else {
            all.last_mut().unwrap().rows.push(line.to_string());
        }
    }
    assert!(all.len() > 10, "{} holds too little", path.display());
    all
}

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("data").is_dir())
        .collect();
    found.sort();
    assert!(!found.is_empty(), "no fixtures under {}", root.display());
    found
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The fixture's input files in `dir/input`, with the modification time they were read with.
fn copy_input(fixture: &Path, dir: &Path) {
    copy_dir(&fixture.join("input"), &dir.join("input"));
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(INPUT_MTIME_S);
    for entry in std::fs::read_dir(dir.join("input")).unwrap() {
        let file = std::fs::File::options()
            .write(true)
            .open(entry.unwrap().path())
            .unwrap();
        file.set_modified(at).unwrap();
    }
}

async fn answers_as_recorded(client: &tokio_postgres::Client, expected: &[Section], what: &str) {
    for section in expected {
        for query in &section.queries {
            assert_eq!(
                text_rows(client, query).await,
                section.rows,
                "{what}: {query}"
            );
        }
    }
}

async fn one(client: &tokio_postgres::Client, sql: &str) -> String {
    text_rows(client, sql).await.remove(0)
}

/// Changes to every table, then each view checked against its query.
async fn go_on(client: &tokio_postgres::Client, expected: &[Section]) {
    client
        .batch_execute(
            "INSERT INTO orders VALUES (2000, 1, 5.00, 3, 7, '2024-04-01', 1.0, false),
               (2001, 4, 6.50, 6, 8, '2024-04-02', 2.5, true);
             UPDATE orders SET amount = amount * 2 WHERE oid % 50 = 1;
             DELETE FROM orders WHERE oid % 31 = 0;
             INSERT INTO customers VALUES (7, 'fay', 'east', NULL);
             UPDATE customers SET name = 'cyd' WHERE id = 3;
             DELETE FROM notes WHERE body = 'a';
             INSERT INTO notes VALUES ('a', 9), (NULL, NULL);
             INSERT INTO events VALUES (0, '2024-01-01 01:00:00', 1);
             FLUSH",
        )
        .await
        .unwrap();
    views_equal_their_queries(client, expected, FILE_ROWS).await;
}

/// The rows of the fixtures' input files.
const FILE_ROWS: &[&str] = &["1 one", "2 two", "3 three", "4 four", "5 five"];

/// Every view equals its query over the tables as they are now (the `=` queries recorded),
/// and the views a batch query cannot run as they do equal what they must hold: the file
/// source's view `file_rows`.
async fn views_equal_their_queries(
    client: &tokio_postgres::Client,
    expected: &[Section],
    file_rows: &[&str],
) {
    for section in expected.iter().filter(|s| s.queries.len() > 1) {
        let view = text_rows(client, &section.queries[0]).await;
        for query in &section.queries[1..] {
            assert_eq!(text_rows(client, query).await, view, "{query}");
        }
    }
    // A division by zero is NULL and a counted error in the view; the errors counted are
    // those of the rows the view holds now.
    assert_eq!(
        text_rows(client, "SELECT * FROM ratios ORDER BY 1").await,
        text_rows(
            client,
            "SELECT oid, CASE WHEN qty = 6 THEN NULL ELSE 100 / (qty - 6) END, qty + 1 \
             FROM orders ORDER BY 1"
        )
        .await
    );
    assert_eq!(
        one(
            client,
            "SELECT row_errors FROM weir_catalog.views WHERE name = 'ratios'"
        )
        .await,
        one(client, "SELECT count(*) FROM orders WHERE qty = 6").await
    );
    // Windows close as the watermark passes them, each once; the late row of sensor 9 came
    // after its window had closed.
    assert_eq!(
        text_rows(client, "SELECT * FROM closed ORDER BY 1, 2").await,
        text_rows(
            client,
            "SELECT window_start, sensor, count(*), max(value) \
             FROM TUMBLE(events, at, INTERVAL '10 seconds') \
             WHERE sensor <> 9 AND window_end <= TIMESTAMP '2024-01-01 00:59:55' \
             GROUP BY window_start, sensor ORDER BY 1, 2"
        )
        .await
    );
    // The sources' rows, each once: the Nexmark streams had ended.
    for view in ["bids", "sellers"] {
        let query = format!("SELECT * FROM {view} ORDER BY 1");
        let recorded = expected
            .iter()
            .find(|s| s.queries[0] == query)
            .unwrap_or_else(|| panic!("{view} recorded"));
        assert_eq!(text_rows(client, &query).await, recorded.rows, "{view}");
    }
    let count = file_rows.len().to_string();
    for _ in 0..300 {
        client.batch_execute("FLUSH").await.unwrap();
        if one(client, "SELECT count(*) FROM file_rows").await == count {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        text_rows(client, "SELECT * FROM file_rows ORDER BY 1").await,
        file_rows
    );
    assert_eq!(
        text_rows(
            client,
            "SELECT name FROM weir_catalog.views WHERE status <> 'running' ORDER BY 1"
        )
        .await,
        ["ratios"],
        "only the view with row errors is degraded"
    );
}

/// Checks the restarted server, changes its tables, takes a checkpoint, kills it, adds an
/// input file and checks again after its own restore: the file source reads the new file's
/// rows after those it had.
async fn restored(dir: &Path, config: &Path, at: &[Section]) {
    let server = start(dir, config).await;
    let client = server.connect().await;
    answers_as_recorded(&client, at, "restored").await;
    go_on(&client, at).await;
    client.batch_execute("CHECKPOINT").await.unwrap();
    let after: Vec<Vec<String>> = relations_now(&client, at).await;
    drop(client);
    server.stop(SIGKILL).await;
    std::fs::write(
        dir.join("input/c.csv"),
        "k,ts,s\n6,2024-01-01 00:00:06,six\n7,2024-01-01 00:00:07,seven\n",
    )
    .unwrap();
    let server = start(dir, config).await;
    let client = server.connect().await;
    let mut file_rows = FILE_ROWS.to_vec();
    file_rows.extend(["6 six", "7 seven"]);
    views_equal_their_queries(&client, at, &file_rows).await;
    assert_eq!(relations_now(&client, at).await, after, "after a restart");
    drop(client);
    server.stop(SIGKILL).await;
}

/// Every relation's rows but the file source's view's.
async fn relations_now(client: &tokio_postgres::Client, at: &[Section]) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    for section in at.iter().filter(|s| !s.queries[0].contains(" file_rows ")) {
        all.push(text_rows(client, &section.queries[0]).await);
    }
    all
}

/// A server in `dir` (where the file source's relative path `input` is), on `dir/data`.
async fn start(dir: &Path, config: &Path) -> ChildServer {
    let config = config.display().to_string();
    ChildServer::start_in(Some(dir), &dir.join("data"), &["--config", &config], &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_an_earlier_version_restarts_with_everything_acknowledged() {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/weir.toml");
    for fixture in fixtures() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        copy_dir(&fixture.join("data"), &dir.join("data"));
        copy_input(&fixture, &dir);
        let at_kill = sections(&fixture.join("at-kill.txt"));
        restored(&dir, &config, &at_kill).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_store_of_an_earlier_version_restores_on_a_new_machine() {
    for fixture in fixtures() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        copy_dir(&fixture.join("data/checkpoint-store"), &dir.join("store"));
        copy_input(&fixture, &dir);
        let config = dir.join("weir.toml");
        std::fs::write(
            &config,
            format!(
                "[checkpoint]\ninterval_ms = 0\nstorage = \"file://{}\"\n",
                dir.join("store").display()
            ),
        )
        .unwrap();
        let at_checkpoint = sections(&fixture.join("at-checkpoint.txt"));
        restored(&dir, &config, &at_checkpoint).await;
    }
}
