//! The wire protocol at the byte level: messages over the size limit, messages that cannot be
//! decoded, and a seeded fuzzer of random and mutated message sequences on a live socket. No
//! sequence may panic the server or stop it answering other clients.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{ChildServer, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir::rng::Rng;

/// A message from the server: its type byte and body.
type Reply = (u8, Vec<u8>);

fn startup_message(params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = 196608u32.to_be_bytes().to_vec();
    for (k, v) in params {
        body.extend(k.as_bytes());
        body.push(0);
        body.extend(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut m = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    m.extend(body);
    m
}

fn message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![kind];
    m.extend(((body.len() + 4) as u32).to_be_bytes());
    m.extend(body);
    m
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// Parse, Bind (no parameters), Execute with `max_rows` and Sync for `query`, on the unnamed
/// statement and portal.
fn parse_bind_execute(query: &str, max_rows: i32) -> Vec<u8> {
    let mut parse = cstr("");
    parse.extend(cstr(query));
    parse.extend(0u16.to_be_bytes());
    let mut bind = cstr("");
    bind.extend(cstr(""));
    bind.extend([0, 0, 0, 0, 0, 0]);
    let mut execute = cstr("");
    execute.extend(max_rows.to_be_bytes());
    let mut bytes = message(b'P', &parse);
    bytes.extend(message(b'B', &bind));
    bytes.extend(message(b'E', &execute));
    bytes.extend(message(b'S', &[]));
    bytes
}

/// The SQLSTATE of an ErrorResponse's body.
fn sqlstate(body: &[u8]) -> Option<String> {
    let mut fields = body.split(|b| *b == 0);
    fields.find_map(|f| {
        f.strip_prefix(b"C")
            .map(|c| String::from_utf8_lossy(c).into_owned())
    })
}

/// The number the environment variable `name` holds, or `default`: how a fuzzer's run is
/// chosen (its cases and its seed).
fn from_env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Reads one message; `None` at the end of the stream (or a reset).
async fn read_reply(socket: &mut TcpStream) -> Option<Reply> {
    let mut header = [0u8; 5];
    socket.read_exact(&mut header).await.ok()?;
    let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    assert!(
        (4..=64 << 20).contains(&length),
        "a reply of type {} with length {length}",
        header[0] as char
    );
    let mut body = vec![0u8; length - 4];
    socket.read_exact(&mut body).await.ok()?;
    Some((header[0], body))
}

/// Reads every reply until the server closes the connection; fails if that takes longer than
/// `limit`.
async fn read_to_end(socket: &mut TcpStream, limit: Duration) -> Vec<Reply> {
    tokio::time::timeout(limit, async {
        let mut replies = Vec::new();
        while let Some(r) = read_reply(socket).await {
            replies.push(r);
        }
        replies
    })
    .await
    .expect("the server neither answered nor closed the connection")
}

/// A connection through startup, up to its first ReadyForQuery.
async fn started(addr: SocketAddr) -> TcpStream {
    let mut socket = TcpStream::connect(addr).await.unwrap();
    socket
        .write_all(&startup_message(&[("user", "weir"), ("database", "weir")]))
        .await
        .unwrap();
    loop {
        let (kind, body) = read_reply(&mut socket).await.expect("startup");
        assert_ne!(kind, b'E', "startup failed: {:?}", sqlstate(&body));
        if kind == b'Z' {
            return socket;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_limit_is_refused_at_its_header() {
    let server = TestServer::start_with(|c| c.message_bytes_max = 1 << 20).await;
    // Only the header of a 1 GiB Query: the server answers without waiting for its body.
    let mut socket = started(server.addr).await;
    socket
        .write_all(&[b'Q', 0x3f, 0xff, 0xff, 0xff])
        .await
        .unwrap();
    let replies = read_to_end(&mut socket, Duration::from_secs(10)).await;
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0].0, b'E');
    assert_eq!(sqlstate(&replies[0].1).as_deref(), Some("54000"));
    // A message under the limit, a statement of almost 1 MiB, is served.
    let client = server.connect().await;
    let long = format!("SELECT 1 {}", " ".repeat((1 << 20) - 100));
    let rows = client.simple_query(&long).await.unwrap();
    let rows = rows
        .iter()
        .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
        .count();
    assert_eq!(rows, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_cannot_be_decoded_ends_its_connection_with_08p01() {
    let server = TestServer::start().await;
    // A length too short to hold itself.
    let mut socket = started(server.addr).await;
    socket.write_all(&[b'Q', 0, 0, 0, 2]).await.unwrap();
    let replies = read_to_end(&mut socket, Duration::from_secs(10)).await;
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(sqlstate(&replies[0].1).as_deref(), Some("08P01"));
    // A startup message too short to hold its protocol version.
    let mut socket = TcpStream::connect(server.addr).await.unwrap();
    socket.write_all(&[0, 0, 0, 6, 0, 3]).await.unwrap();
    let replies = read_to_end(&mut socket, Duration::from_secs(10)).await;
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(sqlstate(&replies[0].1).as_deref(), Some("08P01"));
    server
        .connect()
        .await
        .simple_query("SELECT 1")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execute_row_limit_is_read_as_in_postgresql_whatever_its_size() {
    let server = TestServer::start().await;
    // (limit, rows, whether the portal is suspended after them)
    for (limit, rows, suspended) in [
        (i32::MAX, 3, false),
        (-1, 3, false),
        (0, 3, false),
        (2, 2, true),
    ] {
        let mut socket = started(server.addr).await;
        let bytes = parse_bind_execute("SELECT * FROM generate_series(1, 3)", limit);
        socket.write_all(&bytes).await.unwrap();
        let mut kinds = Vec::new();
        while let Some((kind, _)) = read_reply(&mut socket).await {
            kinds.push(kind);
            if kind == b'Z' {
                break;
            }
        }
        let data_rows = kinds.iter().filter(|k| **k == b'D').count();
        assert_eq!(data_rows, rows, "limit {limit}: {kinds:?}");
        let end = if suspended { b's' } else { b'C' };
        assert!(kinds.contains(&end), "limit {limit}: {kinds:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_statement_of_a_query_message_is_answered_before_the_next_runs() {
    let server = TestServer::start().await;
    let mut socket = started(server.addr).await;
    // The second statement would run for hours: the first one's answer comes first.
    let query = "SELECT 41 + 1; SELECT sum(a * b) \
                 FROM generate_series(1, 100000) AS a, generate_series(1, 100000) AS b";
    socket
        .write_all(&message(b'Q', &cstr(query)))
        .await
        .unwrap();
    let kinds = tokio::time::timeout(Duration::from_secs(30), async {
        let mut kinds = Vec::new();
        while let Some((kind, body)) = read_reply(&mut socket).await {
            kinds.push(kind);
            if kind == b'D' {
                assert!(body.ends_with(b"42"), "{body:?}");
            }
            if kind == b'C' {
                break;
            }
        }
        kinds
    })
    .await
    .expect("the first statement's result did not come before the second ended");
    assert_eq!(kinds, [b'T', b'D', b'C']);
    // Leaving stops the second one.
    drop(socket);
    server
        .connect()
        .await
        .simple_query("SELECT 1")
        .await
        .unwrap();
}

/// A valid message of some kind, with random but plausible contents.
fn valid_message(rng: &mut Rng) -> Vec<u8> {
    const STATEMENTS: &[&str] = &[
        "SELECT 1",
        "SELECT $1::int + 1",
        "SELECT $1::text, $2::bigint",
        "INSERT INTO w VALUES ($1, $2)",
        "SELECT * FROM w WHERE a = $1",
        "CREATE TABLE w (a int, b text)",
        "BEGIN",
        "COMMIT",
        "SELECT count(*) FROM w",
        "",
    ];
    let statement = *rng.pick(STATEMENTS);
    let name = if rng.chance(50) { "" } else { "s1" };
    match rng.below(8) {
        0 => message(b'Q', &cstr(statement)),
        1 => {
            let mut body = cstr(name);
            body.extend(cstr(statement));
            let types = rng.below(3) as u16;
            body.extend(types.to_be_bytes());
            for _ in 0..types {
                body.extend(
                    rng.pick(&[0u32, 23, 25, 20, 1700, 17, 999_999])
                        .to_be_bytes(),
                );
            }
            message(b'P', &body)
        }
        2 => {
            let mut body = cstr("");
            body.extend(cstr(name));
            let formats = rng.below(3) as u16;
            body.extend(formats.to_be_bytes());
            for _ in 0..formats {
                body.extend((rng.below(3) as u16).to_be_bytes());
            }
            let values = rng.below(3) as u16;
            body.extend(values.to_be_bytes());
            for _ in 0..values {
                match rng.below(4) {
                    0 => body.extend((-1i32).to_be_bytes()),
                    1 => {
                        body.extend(4i32.to_be_bytes());
                        body.extend(rng.next_u64().to_be_bytes()[..4].iter());
                    }
                    2 => {
                        body.extend(8i32.to_be_bytes());
                        body.extend(rng.next_u64().to_be_bytes());
                    }
                    _ => {
                        body.extend(2i32.to_be_bytes());
                        body.extend(b"42");
                    }
                }
            }
            let results = rng.below(2) as u16;
            body.extend(results.to_be_bytes());
            for _ in 0..results {
                body.extend((rng.below(2) as u16).to_be_bytes());
            }
            message(b'B', &body)
        }
        // Describe and Close: a statement or a portal, and its name.
        kind @ (3 | 5) => {
            let mut body = vec![*rng.pick(b"SP")];
            body.extend(cstr(name));
            message(if kind == 3 { b'D' } else { b'C' }, &body)
        }
        4 => {
            let mut body = cstr("");
            body.extend((rng.below(3) as i32).to_be_bytes());
            message(b'E', &body)
        }
        6 => message(b'H', &[]),
        _ => message(b'S', &[]),
    }
}

/// One round of the extended protocol, consistent with itself: Parse with a parameter type,
/// Bind with a random value of it in text or binary format, Describe, Execute, Sync.
fn extended_round(rng: &mut Rng) -> Vec<Vec<u8>> {
    let oid = *rng.pick(&[
        16u32, 21, 23, 20, 700, 701, 25, 1082, 1114, 1184, 1186, 1700, 17,
    ]);
    let mut parse = cstr("");
    parse.extend(cstr("SELECT $1"));
    parse.extend(1u16.to_be_bytes());
    parse.extend(oid.to_be_bytes());
    let binary = rng.chance(70);
    let value: Vec<u8> = if binary {
        (0..rng.below(20)).map(|_| rng.next_u64() as u8).collect()
    } else {
        rng.pick(&[
            "1",
            "-1",
            "1.5",
            "2024-01-01",
            "1 day",
            "t",
            "x",
            "",
            "1e999",
        ])
        .as_bytes()
        .to_vec()
    };
    let mut bind = cstr("");
    bind.extend(cstr(""));
    bind.extend(1u16.to_be_bytes());
    bind.extend(u16::from(binary).to_be_bytes());
    bind.extend(1u16.to_be_bytes());
    bind.extend((value.len() as i32).to_be_bytes());
    bind.extend(value);
    bind.extend(1u16.to_be_bytes());
    bind.extend((rng.below(2) as u16).to_be_bytes());
    let mut execute = cstr("");
    execute.extend(0i32.to_be_bytes());
    vec![
        message(b'P', &parse),
        message(b'B', &bind),
        message(b'D', b"P\0"),
        message(b'E', &execute),
        message(b'S', &[]),
    ]
}

/// `m` with one mutation: a byte changed, the length field rewritten, the body cut or grown,
/// or a field's bytes replaced by large counts.
fn mutated(rng: &mut Rng, mut m: Vec<u8>) -> Vec<u8> {
    match rng.below(6) {
        0 => {
            let i = rng.below(m.len() as u64) as usize;
            m[i] = rng.next_u64() as u8;
        }
        1 => {
            let length: u32 = match rng.below(4) {
                0 => rng.below(8) as u32,
                1 => u32::MAX,
                2 => 0x3fff_ffff,
                _ => rng.below(m.len() as u64 + 16) as u32,
            };
            m[1..5].copy_from_slice(&length.to_be_bytes());
        }
        2 => {
            let keep = 1 + rng.below(m.len() as u64) as usize;
            m.truncate(keep);
        }
        3 => {
            let extra = rng.below(32) as usize;
            m.extend((0..extra).map(|_| rng.next_u64() as u8));
            let length = (m.len() - 1) as u32;
            m[1..5].copy_from_slice(&length.to_be_bytes());
        }
        4 if m.len() > 7 => {
            // A count or a length inside the body, made huge or negative.
            let i = 5 + rng.below((m.len() - 7) as u64) as usize;
            let value = *rng.pick(&[0xffffu16, 0x8000, 0x7fff]);
            m[i..i + 2].copy_from_slice(&value.to_be_bytes());
        }
        _ => m = (0..rng.below(64)).map(|_| rng.next_u64() as u8).collect(),
    }
    m
}

/// One fuzz case: the bytes a client sends after (usually) a good startup.
fn case(rng: &mut Rng) -> (bool, bool, Vec<u8>) {
    let startup = !rng.chance(10);
    let mut bytes = Vec::new();
    if !startup {
        let m = startup_message(&[("user", "weir"), ("database", "weir")]);
        let mut m = m;
        let i = rng.below(m.len() as u64) as usize;
        m[i] = rng.next_u64() as u8;
        bytes.extend(m);
    }
    let messages: Vec<Vec<u8>> = if rng.chance(40) {
        extended_round(rng)
    } else {
        (0..1 + rng.below(6)).map(|_| valid_message(rng)).collect()
    };
    let mut whole = startup;
    for m in messages {
        if rng.chance(30) {
            bytes.extend(mutated(rng, m));
            whole = false;
        } else {
            bytes.extend(m);
        }
    }
    (startup, whole, bytes)
}

/// Random and mutated message sequences, each on a connection of its own: the server answers
/// each with well-formed messages and closes the connection when the client does, never
/// panics, and keeps serving. `WEIR_WIRE_FUZZ_CASES` and `WEIR_WIRE_FUZZ_SEED` choose the run
/// (CI runs 10,000 cases, in seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_fuzzer_finds_no_panic_and_no_hang() {
    let cases: u64 = from_env("WEIR_WIRE_FUZZ_CASES", 10_000);
    let seed: u64 = from_env("WEIR_WIRE_FUZZ_SEED", 0x3a5e_0017);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = ChildServer::start(&data).await;
    let setup = server.connect().await;
    setup
        .batch_execute("CREATE TABLE w (a int, b text)")
        .await
        .unwrap();
    let mut rng = Rng::new(seed);
    let mut errors = 0;
    // Replies by type: the cases must reach execution, not only refusals.
    let mut replies_by_kind = std::collections::BTreeMap::<char, u64>::new();
    for i in 0..cases {
        let (startup, whole, bytes) = case(&mut rng);
        let mut socket = if startup {
            started(server.addr).await
        } else {
            TcpStream::connect(server.addr).await.unwrap()
        };
        // The server may close the connection before it has read everything.
        let _ = socket.write_all(&bytes).await;
        if whole {
            // Every message whole: Terminate ends the session once they are answered. A client
            // that closes its side instead has hung up, and its statement is stopped (57014)
            // before its rows are sent.
            let _ = socket.write_all(&[b'X', 0, 0, 0, 4]).await;
        } else {
            // A message cut short or claiming more than was sent would leave the server
            // waiting: closing the client's side ends it.
            let _ = socket.shutdown().await;
        }
        let replies = read_to_end(&mut socket, Duration::from_secs(30)).await;
        for (kind, body) in &replies {
            *replies_by_kind.entry(char::from(*kind)).or_default() += 1;
            if *kind == b'E' {
                errors += 1;
                assert_ne!(
                    sqlstate(body).as_deref(),
                    Some("XX000"),
                    "case {i} (seed {seed}) hit an internal error: {}",
                    String::from_utf8_lossy(body)
                );
            }
        }
        if i % 100 == 99 {
            setup.simple_query("SELECT 1").await.unwrap_or_else(|e| {
                panic!("the server stopped answering after case {i} (seed {seed}): {e}")
            });
        }
    }
    assert!(errors > 0, "the fuzzer should produce refused messages");
    for kind in ['C', 'D', '1', '2', 't', 'T'] {
        assert!(
            replies_by_kind.contains_key(&kind),
            "no '{kind}' reply: {replies_by_kind:?}"
        );
    }
    setup.simple_query("SELECT 1").await.unwrap();
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(!log.contains("panicked"), "the server panicked:\n{log}");
    println!(
        "wire fuzzer: {cases} cases (seed {seed}), replies by type {replies_by_kind:?}, no panic"
    );
}

/// A client that reads the first rows of a 20,000,000-row result and then stops reading
/// holds its query back: the server sends rows as they are computed, so its memory stays
/// under 1 GiB (it gathered whole results before sending: 5.3 GB for this one), through the
/// simple and the extended protocol, and it serves other clients meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_a_huge_result_costs_the_server_little_memory() {
    const GIB: u64 = 1 << 30;
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(&dir.path().join("data")).await;
    let query = "SELECT * FROM generate_series(1, 20000000)";
    let mut peak = 0;
    for request in [message(b'Q', &cstr(query)), parse_bind_execute(query, 0)] {
        let mut socket = started(server.addr).await;
        socket.write_all(&request).await.unwrap();
        loop {
            let (kind, body) = read_reply(&mut socket).await.expect("an answer");
            assert_ne!(kind, b'E', "{:?}", sqlstate(&body));
            if kind == b'D' {
                break;
            }
        }
        // The client reads no more; the server's memory is watched for a while, where it
        // used to grow until the whole result was gathered.
        for _ in 0..40 {
            peak = peak.max(common::rss_bytes(server.pid()));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let other = server.connect().await;
        assert_eq!(common::text_rows(&other, "SELECT 41 + 1").await, ["42"]);
        drop(socket);
    }
    eprintln!(
        "server RSS peak with two unread 20,000,000-row results: {} MiB",
        peak >> 20
    );
    assert!(peak < GIB, "server RSS {} MiB", peak >> 20);
}

/// A Query message of 100,000 statements is checked whole before any runs (a syntax error in
/// the last one means none runs, as in PostgreSQL), but the server does not keep every
/// statement's syntax tree: its memory stays under 1 GiB (it reached 1.4 GiB). Statements
/// past the first few are parsed again as they run, and answer in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_message_of_many_statements_costs_the_server_little_memory() {
    const GIB: u64 = 1 << 30;
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(&dir.path().join("data")).await;
    let mut socket = started(server.addr).await;
    let mut query = "SELECT 1;".repeat(100_000);
    query.push_str("SELEC 2;");
    socket
        .write_all(&message(b'Q', &cstr(&query)))
        .await
        .unwrap();
    let replies = async {
        let mut kinds = Vec::new();
        while let Some((kind, body)) = read_reply(&mut socket).await {
            kinds.push((kind, sqlstate(&body)));
            if kind == b'Z' {
                break;
            }
        }
        kinds
    };
    let replies = common::within_rss(server.pid(), GIB, replies).await;
    let peak = common::rss_bytes(server.pid());
    eprintln!(
        "server RSS after a 100,000-statement message: {} MiB",
        peak >> 20
    );
    assert!(peak < GIB, "server RSS {} MiB", peak >> 20);
    assert_eq!(replies, [(b'E', Some("42601".to_string())), (b'Z', None)]);
    // Forty statements: those kept parsed and those parsed again answer in order.
    let query: String = (1..=40).map(|i| format!("SELECT {i};")).collect();
    socket
        .write_all(&message(b'Q', &cstr(&query)))
        .await
        .unwrap();
    let mut values = Vec::new();
    while let Some((kind, body)) = read_reply(&mut socket).await {
        match kind {
            b'D' => values.push(String::from_utf8_lossy(&body[6..]).into_owned()),
            b'Z' => break,
            b'E' => panic!("{:?}", sqlstate(&body)),
            _ => {}
        }
    }
    let expected: Vec<String> = (1..=40).map(|i| i.to_string()).collect();
    assert_eq!(values, expected);
}

/// A Query message of many real statements, INSERTs each followed by a SELECT of the row it
/// wrote, runs every one in order: each INSERT is applied (and acknowledged), each SELECT sees
/// it, and afterwards the table holds all of them. The server's memory stays under 1 GiB
/// meanwhile. 20,000 statements (about 80 s in a debug build, where a statement costs about
/// 4 ms); `scripts/test --long` runs 100,000 (`WEIR_MESSAGE_STATEMENTS`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_message_of_many_real_statements_runs_each_one() {
    const GIB: u64 = 1 << 30;
    let rows = from_env("WEIR_MESSAGE_STATEMENTS", 20_000) / 2;
    let dir = tempfile::tempdir().unwrap();
    let server = ChildServer::start(&dir.path().join("data")).await;
    let client = server.connect().await;
    client
        .batch_execute("CREATE TABLE t (id bigint PRIMARY KEY, v bigint)")
        .await
        .unwrap();
    let mut socket = started(server.addr).await;
    let query: String = (1..=rows)
        .map(|i| {
            format!(
                "INSERT INTO t VALUES ({i}, {});SELECT v FROM t WHERE id = {i};",
                i * 3
            )
        })
        .collect();
    socket
        .write_all(&message(b'Q', &cstr(&query)))
        .await
        .unwrap();
    let replies = async {
        let (mut tags, mut values) = (Vec::new(), Vec::new());
        while let Some((kind, body)) = read_reply(&mut socket).await {
            match kind {
                b'C' => tags.push(String::from_utf8_lossy(&body[..body.len() - 1]).into_owned()),
                // A DataRow of one column: its count (2 bytes), length (4), then the text.
                b'D' => values.push(String::from_utf8_lossy(&body[6..]).into_owned()),
                b'E' => panic!("{:?}", sqlstate(&body)),
                b'Z' => break,
                _ => {}
            }
        }
        (tags, values)
    };
    let (tags, values) = common::within_rss(server.pid(), GIB, replies).await;
    let rss = common::rss_bytes(server.pid());
    eprintln!(
        "server RSS after {} statements in one message: {} MiB",
        2 * rows,
        rss >> 20
    );
    let expected_tags: Vec<&str> = (0..rows).flat_map(|_| ["INSERT 0 1", "SELECT 1"]).collect();
    assert_eq!(tags, expected_tags);
    let expected_values: Vec<String> = (1..=rows).map(|i| (i * 3).to_string()).collect();
    assert_eq!(values, expected_values);
    assert_eq!(
        common::text_rows(&client, "SELECT count(*), sum(v), min(id), max(id) FROM t").await,
        [format!("{rows} {} 1 {rows}", 3 * rows * (rows + 1) / 2)]
    );
}

/// The SCRAM-SHA-256 client's proof for `password` over an exchange's `auth_message`, with
/// the server's `salt` and `iterations` (RFC 5802).
fn scram_proof(password: &str, salt: &[u8], iterations: u32, auth_message: &str) -> Vec<u8> {
    use ring::{digest, hmac, pbkdf2};
    let mut salted = [0u8; 32];
    let rounds = std::num::NonZeroU32::new(iterations).unwrap();
    pbkdf2::derive(
        pbkdf2::PBKDF2_HMAC_SHA256,
        rounds,
        salt,
        password.as_bytes(),
        &mut salted,
    );
    let key = hmac::Key::new(hmac::HMAC_SHA256, &salted);
    let client_key = hmac::sign(&key, b"Client Key");
    let stored = digest::digest(&digest::SHA256, client_key.as_ref());
    let signature = hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA256, stored.as_ref()),
        auth_message.as_bytes(),
    );
    (client_key.as_ref().iter())
        .zip(signature.as_ref())
        .map(|(a, b)| a ^ b)
        .collect()
}

/// Random bytes, sometimes printable.
fn junk(rng: &mut Rng, most: u64) -> Vec<u8> {
    let printable = rng.chance(50);
    (0..rng.below(most + 1))
        .map(|_| match printable {
            true => b' ' + rng.below(95) as u8,
            false => rng.next_u64() as u8,
        })
        .collect()
}

/// `text` with a random change: a byte replaced, a piece cut, junk put in (which may leave it
/// as it was).
fn garbled(rng: &mut Rng, text: &[u8]) -> Vec<u8> {
    let mut b = text.to_vec();
    let at = rng.below(b.len() as u64 + 1) as usize;
    match rng.below(3) {
        0 if !b.is_empty() => {
            let last = b.len() - 1;
            b[at.min(last)] = rng.next_u64() as u8;
        }
        1 => b.truncate(at),
        _ => {
            let extra = junk(rng, 40);
            b.splice(at..at, extra);
        }
    }
    b
}

/// A SASLInitialResponse: the mechanism and the client-first message.
fn sasl_initial(mechanism: &[u8], first: &[u8]) -> Vec<u8> {
    let mut body = mechanism.to_vec();
    body.push(0);
    body.extend((first.len() as i32).to_be_bytes());
    body.extend(first);
    message(b'p', &body)
}

/// The outcome of one authentication fuzz case.
#[derive(Debug, PartialEq, Eq)]
enum Admitted {
    /// AuthenticationOk: the client got in.
    Yes,
    No,
}

/// Reads replies until the connection ends or `until` matches one; every ErrorResponse must
/// carry a SQLSTATE other than XX000.
async fn replies_until(
    socket: &mut TcpStream,
    until: impl Fn(&Reply) -> bool,
    case: u64,
) -> (Vec<Reply>, Admitted) {
    let mut replies = Vec::new();
    let mut admitted = Admitted::No;
    let read = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(reply) = read_reply(socket).await {
            if reply.0 == b'R' && reply.1.get(..4) == Some(&[0, 0, 0, 0]) {
                admitted = Admitted::Yes;
            }
            if reply.0 == b'E' {
                let code = sqlstate(&reply.1);
                assert!(code.is_some(), "case {case}: an error without a SQLSTATE");
                assert_ne!(code.as_deref(), Some("XX000"), "case {case}");
            }
            let done = until(&reply);
            replies.push(reply);
            if done {
                break;
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "case {case}: the server neither answered nor closed"
    );
    (replies, admitted)
}

/// One SCRAM exchange for `user`, honest or not: the client-first and client-final messages
/// are sometimes garbled, the proof sometimes wrong. Returns whether the server let the
/// client in and whether it should have (the right password, nothing garbled).
async fn scram_case(rng: &mut Rng, addr: SocketAddr, case: u64) -> (Admitted, bool, String) {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let users = ["app", "weir", "nobody", "", "quiet"];
    let user = *rng.pick(&users);
    let password = match rng.chance(50) {
        true => "s3cret pw",
        false => "wrong",
    };
    let mut socket = TcpStream::connect(addr).await.unwrap();
    let mut params = vec![("database", "weir")];
    if !user.is_empty() {
        params.push(("user", user));
    }
    let _ = socket.write_all(&startup_message(&params)).await;
    let (replies, _) = replies_until(&mut socket, |r| r.0 == b'R' || r.0 == b'E', case).await;
    if !matches!(replies.last(), Some((b'R', body)) if body.get(..4) == Some(&[0, 0, 0, 10])) {
        return (Admitted::No, false, String::new());
    }
    let mut honest = true;
    let nonce = b64.encode(rng.next_u64().to_be_bytes());
    let first_bare = format!("n=,r={nonce}");
    let mut first = format!("n,,{first_bare}").into_bytes();
    let mut mechanism = b"SCRAM-SHA-256".to_vec();
    match rng.below(8) {
        0 => {
            let changed = garbled(rng, &first);
            honest &= changed == first;
            first = changed;
        }
        1 => {
            mechanism = garbled(rng, b"SCRAM-SHA-256-PLUS");
            honest &= mechanism == b"SCRAM-SHA-256";
        }
        _ => {}
    }
    let mut initial = sasl_initial(&mechanism, &first);
    if rng.chance(5) {
        let changed = garbled(rng, &initial);
        honest &= changed == initial;
        initial = changed;
    }
    let _ = socket.write_all(&initial).await;
    // A garbled message may claim more bytes than it has: the client sends nothing more, so
    // that the server sees the end of its stream instead of waiting for them.
    if !honest {
        let _ = socket.shutdown().await;
    }
    let (replies, _) = replies_until(&mut socket, |r| r.0 == b'R' || r.0 == b'E', case).await;
    let server_first = match replies.last() {
        Some((b'R', body)) if body.get(..4) == Some(&[0, 0, 0, 11]) => {
            String::from_utf8_lossy(&body[4..]).into_owned()
        }
        _ => return (Admitted::No, false, String::new()),
    };
    let field = |name: &str| {
        server_first
            .split(',')
            .find_map(|f| f.strip_prefix(name))
            .unwrap_or_default()
            .to_string()
    };
    let combined = field("r=");
    let salt = b64.decode(field("s=")).unwrap_or_default();
    let iterations: u32 = field("i=").parse().unwrap_or(4096);
    let without_proof = format!("c=biws,r={combined}");
    let auth_message = format!("{first_bare},{server_first},{without_proof}");
    let mut proof = scram_proof(password, &salt, iterations.max(1), &auth_message);
    if rng.chance(20) {
        let i = rng.below(proof.len() as u64) as usize;
        proof[i] ^= 1 << rng.below(8);
        honest = false;
    }
    let mut last = format!("{without_proof},p={}", b64.encode(&proof)).into_bytes();
    if rng.chance(15) {
        let changed = garbled(rng, &last);
        honest &= changed == last;
        last = changed;
    }
    let _ = socket.write_all(&message(b'p', &last)).await;
    let _ = socket.shutdown().await;
    let (_, admitted) = replies_until(&mut socket, |r| r.0 == b'Z' || r.0 == b'E', case).await;
    let should = honest && password == "s3cret pw" && matches!(user, "app" | "weir");
    let sent = format!(
        "{user} {password:?}: {:?} {:?} then {:?}",
        String::from_utf8_lossy(&mechanism),
        String::from_utf8_lossy(&first),
        String::from_utf8_lossy(&last)
    );
    (admitted, should, sent)
}

/// A TLS ClientHello, as rustls writes it.
fn client_hello() -> Vec<u8> {
    use tokio_rustls::rustls;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut client = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let mut hello = Vec::new();
    client.write_tls(&mut hello).unwrap();
    hello
}

/// Garbled TLS openings, after an SSLRequest or at once: the server closes the connection
/// (after a TLS alert, or an ErrorResponse before TLS began) and goes on.
async fn tls_case(rng: &mut Rng, addr: SocketAddr, hello: &[u8], case: u64) {
    let mut socket = TcpStream::connect(addr).await.unwrap();
    let mut bytes = Vec::new();
    if rng.chance(50) {
        bytes.extend([0, 0, 0, 8, 4, 210, 22, 47]);
    }
    let mut hello = hello.to_vec();
    for _ in 0..1 + rng.below(4) {
        let i = rng.below(hello.len() as u64) as usize;
        match rng.below(3) {
            0 => hello[i] = rng.next_u64() as u8,
            1 => hello.truncate(i.max(1)),
            _ => hello.splice(i..i, junk(rng, 64)).for_each(drop),
        }
    }
    bytes.extend(hello);
    let _ = socket.write_all(&bytes).await;
    let _ = socket.shutdown().await;
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), socket.read_to_end(&mut rest)).await;
    assert!(
        read.is_ok(),
        "case {case}: the server neither answered nor closed"
    );
}

/// The startup, SCRAM and TLS exchanges fuzzed on a live socket against a server with TLS,
/// SCRAM and clear-text rules: no case panics the server, hangs or gets an internal error;
/// a client gets in exactly when it proved the right password without garbling anything;
/// and the server keeps serving. `WEIR_AUTH_FUZZ_CASES` and `WEIR_AUTH_FUZZ_SEED` choose the
/// run (CI runs 3,000 cases, in seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_fuzzer_lets_in_only_the_right_password() {
    let cases: u64 = from_env("WEIR_AUTH_FUZZ_CASES", 3_000);
    let seed: u64 = from_env("WEIR_AUTH_FUZZ_SEED", 0x5c4a_0023);
    let dir = tempfile::tempdir().unwrap();
    let [_, cert, key] = common::certificate(dir.path());
    let config = dir.path().join("weir.toml");
    std::fs::write(
        &config,
        format!(
            "[tls]\ncert = \"{}\"\nkey = \"{}\"\n\
             [[auth]]\naddress = \"loopback\"\nuser = \"clear\"\nmethod = \"password\"\n\
             [[auth]]\naddress = \"loopback\"\nmethod = \"scram-sha-256\"\n",
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let data = dir.path().join("data");
    let config = config.to_str().unwrap();
    let server = ChildServer::start_with_env(
        &data,
        &["--config", config],
        &[("WEIR_SUPERUSER_PASSWORD", "s3cret pw")],
    )
    .await;
    let conn = format!(
        "host=127.0.0.1 port={} user=weir password='s3cret pw' dbname=weir",
        server.addr.port()
    );
    let setup = common::connect(&conn).await;
    setup
        .batch_execute(
            "CREATE ROLE app LOGIN PASSWORD 's3cret pw'; \
             CREATE ROLE clear LOGIN PASSWORD 's3cret pw'; \
             CREATE ROLE quiet PASSWORD 's3cret pw'",
        )
        .await
        .unwrap();
    let hello = client_hello();
    let mut rng = Rng::new(seed);
    let (mut admitted, mut honest, mut clear_text, mut tls) = (0u64, 0u64, 0u64, 0u64);
    for i in 0..cases {
        match rng.below(10) {
            0..=5 => {
                let (got, should, sent) = scram_case(&mut rng, server.addr, i).await;
                assert_eq!(
                    got == Admitted::Yes,
                    should,
                    "case {i} (seed {seed}): admitted {got:?}, should be {should}: {sent}"
                );
                admitted += u64::from(got == Admitted::Yes);
                honest += u64::from(should);
            }
            6 | 7 => {
                // A clear-text password, right or garbled.
                let right = rng.chance(40);
                let password = match right {
                    true => b"s3cret pw".to_vec(),
                    false => garbled(&mut rng, b"s3cret pw"),
                };
                let mut socket = TcpStream::connect(server.addr).await.unwrap();
                let start = startup_message(&[("user", "clear"), ("database", "weir")]);
                let _ = socket.write_all(&start).await;
                let mut body = password.clone();
                body.push(0);
                let _ = socket.write_all(&message(b'p', &body)).await;
                let _ = socket.shutdown().await;
                let (_, got) = replies_until(&mut socket, |r| r.0 == b'Z' || r.0 == b'E', i).await;
                let should = password == b"s3cret pw";
                assert_eq!(got == Admitted::Yes, should, "case {i} (seed {seed})");
                clear_text += 1;
            }
            _ => {
                tls_case(&mut rng, server.addr, &hello, i).await;
                tls += 1;
            }
        }
        if i % 100 == 99 {
            setup.simple_query("SELECT 1").await.unwrap_or_else(|e| {
                panic!("the server stopped answering after case {i} (seed {seed}): {e}")
            });
        }
    }
    assert!(
        admitted > 0 && honest == admitted,
        "{admitted} admitted, {honest} honest"
    );
    setup.simple_query("SELECT 1").await.unwrap();
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(!log.contains("panicked"), "the server panicked:\n{log}");
    println!(
        "authentication fuzzer: {cases} cases (seed {seed}): {admitted} SCRAM logins of \
         {honest} honest ones, {clear_text} clear-text, {tls} TLS openings; no panic"
    );
}
