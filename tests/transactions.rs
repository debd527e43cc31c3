//! Transaction blocks under concurrency, against the server binary: sessions run random
//! transfer blocks between two tables over a few hot rows, so that many conflict. First
//! committer wins must leave a history that is serializable: on every row, the committed
//! blocks that changed it read each of its versions exactly once, the order they imply over
//! all rows has no cycle, and the balances are what those blocks wrote. Meanwhile a view
//! joining both tables is read without pause and never shows half a COMMIT (the sum the
//! transfers keep is always whole), also across a SIGKILL in the middle of the commits.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{text_rows, ChildServer};
use weir::rng::Rng;

/// Rows in each table: few, so that blocks conflict often.
const ROWS: i64 = 5;
const START: i64 = 1000;
const SESSIONS: u64 = 6;

/// A block: moves `amount` from row `from` of `a` (read at `from_version`) to row `to` of `b`
/// (read at `to_version`).
#[derive(Debug, Clone, Copy)]
struct Transfer {
    id: u64,
    from: i64,
    from_version: i64,
    to: i64,
    to_version: i64,
    amount: i64,
}

/// What became of the blocks one session sent.
#[derive(Default)]
struct Outcome {
    committed: Vec<Transfer>,
    /// Refused at COMMIT with 40001.
    conflicts: u64,
    /// COMMIT sent and the connection lost before its answer.
    in_doubt: Vec<Transfer>,
}

const SCHEMA: &str = "
    CREATE TABLE a (id bigint PRIMARY KEY, balance bigint, version bigint);
    CREATE TABLE b (id bigint PRIMARY KEY, balance bigint, version bigint);
    CREATE TABLE done (block bigint PRIMARY KEY);
    INSERT INTO a SELECT i, 1000, 0 FROM generate_series(1, 5) AS s(i);
    INSERT INTO b SELECT i, 1000, 0 FROM generate_series(1, 5) AS s(i);
    CREATE MATERIALIZED VIEW total AS
      SELECT sum(a.balance + b.balance) AS s, count(*) AS n FROM a JOIN b ON a.id = b.id";

/// The values of a simple query's first row, as integers (none for no row).
async fn one(
    client: &tokio_postgres::Client,
    sql: &str,
) -> Result<Vec<i64>, tokio_postgres::Error> {
    let messages = client.simple_query(sql).await?;
    Ok(common::rows_as_text(messages)
        .first()
        .map(|r| r.split(' ').map(|v| v.parse().unwrap()).collect())
        .unwrap_or_default())
}

/// Runs transfer blocks until `blocks` are done or the server goes away. Block ids are
/// `session * 1_000_000 + n`.
async fn transfers(conn: String, session: u64, blocks: u64) -> Outcome {
    let mut out = Outcome::default();
    let Ok((client, connection)) = tokio_postgres::connect(&conn, tokio_postgres::NoTls).await
    else {
        return out;
    };
    tokio::spawn(connection);
    let mut rng = Rng::new(session);
    for n in 0..blocks {
        let (from, to) = (
            1 + rng.below(ROWS as u64) as i64,
            1 + rng.below(ROWS as u64) as i64,
        );
        let id = session * 1_000_000 + n;
        let amount = 1 + rng.below(50) as i64;
        let body = async {
            client.batch_execute("BEGIN").await?;
            let ra = one(
                &client,
                &format!("SELECT balance, version FROM a WHERE id = {from}"),
            )
            .await?;
            let rb = one(
                &client,
                &format!("SELECT balance, version FROM b WHERE id = {to}"),
            )
            .await?;
            client
                .batch_execute(&format!(
                    "UPDATE a SET balance = {}, version = {} WHERE id = {from};
                     UPDATE b SET balance = {}, version = {} WHERE id = {to};
                     INSERT INTO done VALUES ({id})",
                    ra[0] - amount,
                    ra[1] + 1,
                    rb[0] + amount,
                    rb[1] + 1
                ))
                .await?;
            Ok::<_, tokio_postgres::Error>(Transfer {
                id,
                from,
                from_version: ra[1],
                to,
                to_version: rb[1],
                amount,
            })
        };
        let transfer = match body.await {
            Ok(t) => t,
            Err(e) if e.as_db_error().is_none() => break, // the server went away
            Err(e) => panic!("block {id}: {e:?}"),
        };
        match client.batch_execute("COMMIT").await {
            Ok(()) => out.committed.push(transfer),
            Err(e) => match e.code().map(|c| c.code()) {
                Some("40001") => out.conflicts += 1,
                None => {
                    out.in_doubt.push(transfer);
                    break;
                }
                Some(other) => panic!("COMMIT of block {id}: {other}: {e:?}"),
            },
        }
    }
    out
}

/// Reads the view without pause until `stop`: every read must show the whole sum. Returns the
/// number of reads.
async fn watch(conn: String, stop: Arc<AtomicBool>, reads: Arc<AtomicU64>) {
    let Ok((client, connection)) = tokio_postgres::connect(&conn, tokio_postgres::NoTls).await
    else {
        return;
    };
    tokio::spawn(connection);
    while !stop.load(Ordering::Relaxed) {
        match one(&client, "SELECT s, n FROM total").await {
            Ok(row) => assert_eq!(
                row,
                [2 * ROWS * START, ROWS],
                "the view showed half a COMMIT"
            ),
            Err(e) if e.as_db_error().is_none() => return,
            Err(e) => panic!("{e:?}"),
        }
        reads.fetch_add(1, Ordering::Relaxed);
    }
}

/// Checks that `applied` (the blocks that took effect) is a serializable history that leads to
/// the tables' rows: on each row, the blocks that changed it read its versions 0, 1, ... once
/// each, up to the row's version; those orders together have no cycle; and each balance is
/// its start plus what the blocks moved.
async fn serializable(client: &tokio_postgres::Client, applied: &[Transfer]) {
    let mut claims: BTreeMap<(char, i64), BTreeMap<i64, u64>> = BTreeMap::new();
    let mut moved: BTreeMap<(char, i64), i64> = BTreeMap::new();
    for t in applied {
        for (row, version, delta) in [
            (('a', t.from), t.from_version, -t.amount),
            (('b', t.to), t.to_version, t.amount),
        ] {
            let earlier = claims.entry(row).or_default().insert(version, t.id);
            assert!(
                earlier.is_none(),
                "blocks {earlier:?} and {} both read {row:?} at version {version}",
                t.id
            );
            *moved.entry(row).or_default() += delta;
        }
    }
    for table in ['a', 'b'] {
        for row in text_rows(client, &format!("SELECT id, balance, version FROM {table}")).await {
            let v: Vec<i64> = row.split(' ').map(|x| x.parse().unwrap()).collect();
            let key = (table, v[0]);
            let versions: Vec<i64> = claims
                .get(&key)
                .map(|c| c.keys().copied().collect())
                .unwrap_or_default();
            assert_eq!(
                versions,
                (0..v[2]).collect::<Vec<_>>(),
                "versions read of {key:?}"
            );
            assert_eq!(
                v[1],
                START + moved.get(&key).copied().unwrap_or(0),
                "balance of {key:?}"
            );
        }
    }
    // Each row orders the blocks that changed it; together the orders must have no cycle.
    let mut after: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut before_count: BTreeMap<u64, usize> = applied.iter().map(|t| (t.id, 0)).collect();
    for chain in claims.values() {
        let ids: Vec<u64> = chain.values().copied().collect();
        for w in ids.windows(2) {
            after.entry(w[0]).or_default().push(w[1]);
            *before_count.get_mut(&w[1]).unwrap() += 1;
        }
    }
    let mut ready: Vec<u64> = before_count
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(id, _)| *id)
        .collect();
    let mut ordered = 0;
    while let Some(id) = ready.pop() {
        ordered += 1;
        for next in after.get(&id).cloned().unwrap_or_default() {
            let n = before_count.get_mut(&next).unwrap();
            *n -= 1;
            if *n == 0 {
                ready.push(next);
            }
        }
    }
    assert_eq!(
        ordered,
        applied.len(),
        "the committed blocks' orders have a cycle"
    );
}

/// Runs `SESSIONS` sessions of transfers (at most `blocks` each, fewer if the server goes away)
/// and a reader of the view until the sessions end; returns their outcomes and the reads.
async fn run(server: &ChildServer, blocks: u64, seed: u64) -> (Vec<Outcome>, u64) {
    let conn = format!(
        "host=127.0.0.1 port={} user=weir dbname=weir",
        server.addr.port()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let reader = tokio::spawn(watch(conn.clone(), stop.clone(), reads.clone()));
    let sessions: Vec<_> = (0..SESSIONS)
        .map(|s| tokio::spawn(transfers(conn.clone(), seed * 100 + s, blocks)))
        .collect();
    let mut outcomes = Vec::new();
    for s in sessions {
        outcomes.push(s.await.unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    reader.await.unwrap();
    (outcomes, reads.load(Ordering::Relaxed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_blocks_commit_a_serializable_history_and_views_never_see_half_of_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("weir.toml");
    std::fs::write(
        &config,
        "barrier_interval_ms = 50\n[checkpoint]\ninterval_ms = 300\n",
    )
    .unwrap();
    let args = ["--config", config.to_str().unwrap()];
    let server = ChildServer::start_with(&data, &args).await;
    let client = server.connect().await;
    client.batch_execute(SCHEMA).await.unwrap();

    // Sessions run to their end.
    let (outcomes, reads) = run(&server, 40, 1).await;
    let committed: Vec<Transfer> = outcomes.iter().flat_map(|o| o.committed.clone()).collect();
    let conflicts: u64 = outcomes.iter().map(|o| o.conflicts).sum();
    eprintln!(
        "{} blocks committed, {conflicts} refused with 40001, {reads} reads of the view",
        committed.len()
    );
    assert!(
        conflicts > 0 && committed.len() as u64 > SESSIONS,
        "{conflicts} conflicts"
    );
    assert!(reads > 0);
    serializable(&client, &committed).await;
    let done: BTreeSet<u64> = text_rows(&client, "SELECT block FROM done")
        .await
        .iter()
        .map(|b| b.parse().unwrap())
        .collect();
    assert_eq!(done, committed.iter().map(|t| t.id).collect());

    // Killed while sessions commit: after the restart, every acknowledged block is there, a block
    // whose COMMIT went unanswered is there whole or not at all, and the history is still one.
    let killer = {
        let pid = server.pid();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            // SAFETY: kill(2) on the server process this test started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        })
    };
    let (outcomes, _) = run(&server, 1_000_000, 2).await;
    killer.await.unwrap();
    let _ = server.ended().await;
    let server = ChildServer::start_with(&data, &args).await;
    let client = server.connect().await;
    client.batch_execute("FLUSH").await.unwrap();
    let done: BTreeSet<u64> = text_rows(&client, "SELECT block FROM done")
        .await
        .iter()
        .map(|b| b.parse().unwrap())
        .collect();
    let acknowledged: Vec<Transfer> = outcomes.iter().flat_map(|o| o.committed.clone()).collect();
    let in_doubt: Vec<Transfer> = outcomes.iter().flat_map(|o| o.in_doubt.clone()).collect();
    assert!(!acknowledged.is_empty());
    for t in &acknowledged {
        assert!(done.contains(&t.id), "acknowledged block {} lost", t.id);
    }
    let mut applied = committed;
    applied.extend(acknowledged.iter().copied());
    applied.extend(in_doubt.iter().filter(|t| done.contains(&t.id)).copied());
    assert_eq!(
        done,
        applied.iter().map(|t| t.id).collect(),
        "blocks applied that were never committed"
    );
    serializable(&client, &applied).await;
    assert_eq!(
        text_rows(&client, "SELECT s, n FROM total").await,
        [format!("{} {ROWS}", 2 * ROWS * START)]
    );
    server.stop(libc::SIGTERM).await;
}
