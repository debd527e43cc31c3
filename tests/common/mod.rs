//! A Weir server for tests: in this process, on a free loopback port, with its own data
//! directory.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use weir::config::Config;
use weir::db::Database;

pub struct TestServer {
    pub addr: SocketAddr,
    /// The server's database, for tests that reach below SQL.
    #[allow(dead_code)]
    pub db: Arc<Database>,
    pub dir: tempfile::TempDir,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    pub async fn start() -> TestServer {
        TestServer::start_with(|_| {}).await
    }

    pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> TestServer {
        let dir = tempfile::tempdir().expect("temp dir");
        TestServer::start_in(dir, adjust).await
    }

    /// Starts a server on an existing data directory (to test restarts).
    pub async fn start_in(dir: tempfile::TempDir, adjust: impl FnOnce(&mut Config)) -> TestServer {
        let mut config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: dir.path().to_path_buf(),
            ..Config::default()
        };
        adjust(&mut config);
        let listener = tokio::net::TcpListener::bind(config.listen).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tls = weir::server::Tls::load(config.tls.as_ref()).expect("TLS certificate");
        let db: Arc<Database> = Database::open(config).await.expect("open database");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(weir::server::serve(db.clone(), listener, tls, async {
            let _ = rx.await;
        }));
        TestServer {
            addr,
            db,
            dir,
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    pub fn conn_str(&self) -> String {
        format!(
            "host={} port={} user=weir dbname=weir",
            self.addr.ip(),
            self.addr.port()
        )
    }

    pub async fn connect(&self) -> tokio_postgres::Client {
        connect(&self.conn_str()).await
    }

    /// Stops accepting connections and returns the data directory.
    pub async fn stop(mut self) -> tempfile::TempDir {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        let dir = tempfile::tempdir().unwrap();
        std::mem::replace(&mut self.dir, dir)
    }

    /// Stops the server and waits until its database has closed (every client connection
    /// must be gone), so that a restart in the same directory finds RocksDB and the data
    /// directory unlocked and nothing else writing to it. Returns the data directory.
    #[allow(dead_code)]
    pub async fn stop_and_close(self) -> tempfile::TempDir {
        let closed = self.db.closed();
        let dir = self.stop().await;
        for _ in 0..3000 {
            if closed.is_closed() {
                return dir;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the database did not close within 30 s of stopping: is a client still connected?");
    }
}

/// Writes a config file into `dir` under which barriers come only when asked for (FLUSH, DDL,
/// CHECKPOINT) and no checkpoint is periodic, so that a test can count barriers; returns its
/// path, for `--config`.
pub fn barriers_on_request_config(dir: &std::path::Path) -> std::path::PathBuf {
    let config = dir.join("weir.toml");
    std::fs::write(
        &config,
        "barrier_interval_ms = 3600000\n[checkpoint]\ninterval_ms = 0\n",
    )
    .expect("write the config file");
    config
}

/// The `weir` binary running as a child process: for restarts and crashes.
pub struct ChildServer {
    pub addr: SocketAddr,
    /// The admin HTTP port, when `--admin-listen` asked for one (`127.0.0.1:0` lets the
    /// server pick it).
    pub admin: Option<SocketAddr>,
    child: tokio::process::Child,
    /// The server's log (stdout and stderr), next to its data directory.
    pub log: std::path::PathBuf,
}

impl ChildServer {
    pub async fn start(data_dir: &std::path::Path) -> ChildServer {
        ChildServer::start_with(data_dir, &[]).await
    }

    /// Starts the server with more command-line arguments.
    pub async fn start_with(data_dir: &std::path::Path, args: &[&str]) -> ChildServer {
        ChildServer::start_with_env(data_dir, args, &[]).await
    }

    /// Starts the server with more command-line arguments and environment variables.
    pub async fn start_with_env(
        data_dir: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> ChildServer {
        ChildServer::start_in(None, data_dir, args, env).await
    }

    /// Starts the server in working directory `cwd` (relative paths in statements are
    /// relative to it), or in the test's.
    pub async fn start_in(
        cwd: Option<&std::path::Path>,
        data_dir: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> ChildServer {
        let log = data_dir.with_extension("log");
        // The server picks its own port and names it when it is ready: a port chosen here
        // and freed for it could be taken by a server another test starts meanwhile.
        let logged_before = std::fs::metadata(&log).map_or(0, |m| m.len());
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log file");
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_weir"));
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        let mut child = command
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(args)
            .envs(env.iter().copied())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .expect("start weir");
        // The server is ready once it has rebuilt its state; wait for that.
        for _ in 0..2400 {
            if let Some((addr, admin)) = ready(&log, logged_before) {
                return ChildServer {
                    addr,
                    admin,
                    child,
                    log,
                };
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "weir ended ({status}) before it was ready: see {}",
                    log.display()
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("weir was not ready in 2 minutes: see {}", log.display());
    }

    pub async fn connect(&self) -> tokio_postgres::Client {
        let conn = format!(
            "host={} port={} user=weir dbname=weir",
            self.addr.ip(),
            self.addr.port()
        );
        connect(&conn).await
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Waits for the process to end by itself (a failpoint's abort), for at most a minute.
    pub async fn ended(mut self) -> std::process::ExitStatus {
        let within = std::time::Duration::from_secs(60);
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => status.expect("wait"),
            Err(_) => panic!("weir did not end in a minute: see {}", self.log.display()),
        }
    }

    /// Sends `signal` (15 = SIGTERM, 9 = SIGKILL) and waits for the process to end.
    pub async fn stop(mut self, signal: i32) -> std::process::ExitStatus {
        let pid = self.child.id().expect("running") as i32;
        // SAFETY: kill(2) on a child process we own.
        assert_eq!(unsafe { kill(pid, signal) }, 0);
        self.child.wait().await.expect("wait")
    }
}

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

/// A connection to `conn` (a server of Weir's or PostgreSQL's), its messages handled on a
/// task of its own.
pub async fn connect(conn: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(conn, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A connection to `server` as `user` with `password`, or the server's refusal as `SQLSTATE
/// message`.
pub async fn connect_as(
    server: &TestServer,
    user: &str,
    password: &str,
) -> Result<tokio_postgres::Client, String> {
    let conn = format!(
        "host=127.0.0.1 port={} user={user} password='{password}' dbname=weir",
        server.addr.port()
    );
    match tokio_postgres::connect(&conn, tokio_postgres::NoTls).await {
        Ok((client, connection)) => {
            tokio::spawn(connection);
            Ok(client)
        }
        Err(e) => Err(match e.as_db_error() {
            Some(db) => format!("{} {}", db.code().code(), db.message()),
            None => e.to_string(),
        }),
    }
}

/// Waits (up to `within`) until every source has fed all its rows, none having failed, then
/// until the views have them (FLUSH carries through only what sources have produced).
pub async fn drain(client: &tokio_postgres::Client, within: std::time::Duration) {
    let started = std::time::Instant::now();
    loop {
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE NOT done) AS running, \
                 count(*) FILTER (WHERE error IS NOT NULL) AS failed FROM weir_catalog.sources",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>("failed"), 0, "a source failed");
        if row.get::<_, i64>("running") == 0 {
            client.batch_execute("FLUSH").await.unwrap();
            return;
        }
        assert!(
            started.elapsed() < within,
            "the sources did not end within {within:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Every row `sql` returns, in the order returned, as text: columns joined by spaces, NULL
/// as `NULL`.
pub async fn text_rows(client: &tokio_postgres::Client, sql: &str) -> Vec<String> {
    rows_as_text(client.simple_query(sql).await.unwrap())
}

/// The rows of a simple query's answer, each as its values (NULL for a null) joined by spaces.
pub fn rows_as_text(messages: Vec<tokio_postgres::SimpleQueryMessage>) -> Vec<String> {
    (messages.into_iter())
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(
                (0..r.len())
                    .map(|i| r.get(i).unwrap_or("NULL").to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            _ => None,
        })
        .collect()
}

/// The server's resident memory, from `/proc`.
pub fn rss_bytes(pid: u32) -> u64 {
    proc_status_bytes(pid, "VmRSS:")
}

/// The most resident memory the server has had since it started, from `/proc`.
pub fn peak_rss_bytes(pid: u32) -> u64 {
    proc_status_bytes(pid, "VmHWM:")
}

fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// Runs `work` while process `pid`'s resident memory is watched (every 20 ms): its output, or a
/// panic naming the RSS if it reaches `bytes` first.
pub async fn within_rss<T>(pid: u32, bytes: u64, work: impl std::future::Future<Output = T>) -> T {
    tokio::select! {
        out = work => out,
        peak = rss_reaches(pid, bytes) => panic!("server RSS {} MiB", peak >> 20),
    }
}

/// Completes, with the RSS seen, once process `pid`'s resident memory reaches `bytes`.
async fn rss_reaches(pid: u32, bytes: u64) -> u64 {
    loop {
        let rss = rss_bytes(pid);
        if rss >= bytes {
            return rss;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// One HTTP request: the status code and the body.
pub async fn http(addr: std::net::SocketAddr, request_line: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket
        .write_all(
            format!("{request_line} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut response = String::new();
    socket.read_to_string(&mut response).await.unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// The addresses a server names in `log` past its first `from` bytes, once it is ready:
/// its own ("weir is ready: connect with psql -h 127.0.0.1 -p 5432 -U weir -d weir") and its admin
/// port's ("admin HTTP port on 127.0.0.1:8080"), if it has one.
fn ready(log: &std::path::Path, from: u64) -> Option<(SocketAddr, Option<SocketAddr>)> {
    let text = std::fs::read(log).ok()?;
    let text = String::from_utf8_lossy(text.get(from as usize..)?);
    let (before, rest) = text.split_once("weir is ready: connect with psql -h ")?;
    let (_, rest) = rest.split_once(" -p ")?;
    let port: u16 = rest.split(' ').next()?.parse().ok()?;
    let admin = before
        .split_once("admin HTTP port on ")
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok());
    Some((SocketAddr::from(([127, 0, 0, 1], port)), admin))
}

/// Records that the calling test could not run, and why: printed, and appended to the file
/// `WEIR_SKIPS` names, which `scripts/test` counts and lists in its last lines. A test that
/// cannot run must never pass silently.
pub fn skip(test: &str, reason: &str) {
    use std::io::Write;
    eprintln!("SKIPPED {test}: {reason}");
    if let Some(path) = std::env::var_os("WEIR_SKIPS") {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("the file WEIR_SKIPS names can be written");
        writeln!(file, "{test}: {reason}").expect("the file WEIR_SKIPS names can be written");
    }
}

/// The Python with the tests' packages: the virtual environment `scripts/deps` makes under
/// `~/.cache/weir/tools/python`, or `WEIR_PYTHON`.
pub fn python() -> std::path::PathBuf {
    if let Some(python) = std::env::var_os("WEIR_PYTHON") {
        return python.into();
    }
    let home = std::env::var_os("HOME").expect("HOME is set");
    std::path::Path::new(&home).join(".cache/weir/tools/python/bin/python")
}

/// A real S3-compatible server for the test's lifetime: moto's (`python -m moto.server`, from
/// the virtual environment `scripts/deps` makes), on a free loopback port, killed when dropped.
pub struct S3Server {
    pub addr: std::net::SocketAddr,
    _child: tokio::process::Child,
}

impl S3Server {
    pub async fn start() -> S3Server {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let child = tokio::process::Command::new(python())
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p"])
            .arg(addr.port().to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("scripts/deps's Python runs");
        for _ in 0..300 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return S3Server {
                    addr,
                    _child: child,
                };
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("moto's S3 server did not start: run scripts/deps (tests/python-requirements.txt)");
    }

    /// The options a Weir server needs to reach it.
    pub fn options(&self) -> std::collections::BTreeMap<String, String> {
        [
            ("endpoint", format!("http://{}", self.addr)),
            ("allow_http", "true".into()),
            ("region", "us-east-1".into()),
            ("access_key_id", "weir".into()),
            ("secret_access_key", "weir-secret".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    pub async fn create_bucket(&self, bucket: &str) {
        let (status, body) = http(self.addr, &format!("PUT /{bucket}")).await;
        assert_eq!(status, 200, "create bucket: {body}");
    }
}

/// A certificate authority (`ca.crt`) and a certificate it signed for `localhost` and
/// 127.0.0.1 (`server.crt`, key `server.key`), as PEM files in `dir`; the CA's path first.
pub fn certificate(dir: &std::path::Path) -> [std::path::PathBuf; 3] {
    let openssl = |args: String| {
        let out = std::process::Command::new("openssl")
            .current_dir(dir)
            .args(args.split(' '))
            .output()
            .expect("openssl");
        assert!(out.status.success(), "{out:?}");
    };
    let key = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
    openssl(format!(
        "req -x509 {key} -days 2 -subj /CN=weir-test-ca -keyout ca.key -out ca.crt"
    ));
    openssl(format!(
        "req {key} -subj /CN=localhost -keyout server.key -out server.csr"
    ));
    std::fs::write(
        dir.join("ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    openssl(
        "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile ext \
         -out server.crt"
            .into(),
    );
    ["ca.crt", "server.crt", "server.key"].map(|name| dir.join(name))
}
