//! The `weir` server as a child process: started on one data directory again and again, with
//! a failpoint armed or none, and killed or left to abort.

use std::io::{BufRead, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::replay::connect;

/// Starts the `weir` binary on one data directory, again and again.
pub(super) struct Launcher {
    pub(super) weir: PathBuf,
    pub(super) data: PathBuf,
    pub(super) config: PathBuf,
    /// Every start's output, appended.
    pub(super) log: PathBuf,
}

pub(super) enum Death {
    /// Ended by an armed failpoint (SIGABRT).
    Aborted,
    /// Killed with SIGKILL.
    Killed,
}

pub(super) struct Server {
    pub(super) child: Child,
    pub(super) port: u16,
}

impl Launcher {
    /// Starts the server with `failpoints` armed and waits until it listens; `None` if it
    /// aborted at a failpoint first. Any other exit is an error.
    pub(super) async fn start(&self, failpoints: Option<&str>) -> Result<Option<Server>, String> {
        let (mut child, port) = self.spawn(failpoints)?;
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                return match aborted(status) {
                    true if failpoints.is_some() => Ok(None),
                    _ => Err(format!("the server exited while starting: {status}")),
                };
            }
            // The port is bound before recovery, which may still abort: ready means a
            // session that answers.
            if answers(port).await {
                return Ok(Some(Server { child, port }));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err("the server did not listen within 300 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How long the log is: where the next start's output begins.
    pub(super) fn log_len(&self) -> u64 {
        std::fs::metadata(&self.log).map_or(0, |m| m.len())
    }

    /// Whether the output of the starts since the log was `from` long holds `text`.
    pub(super) fn logged_since(&self, from: u64, text: &str) -> Result<bool, String> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file =
            std::fs::File::open(&self.log).map_err(|e| format!("{}: {e}", self.log.display()))?;
        file.seek(SeekFrom::Start(from))
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let mut since = Vec::new();
        file.read_to_end(&mut since)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        Ok(String::from_utf8_lossy(&since).contains(text))
    }

    /// Starts the server and kills it `after` later, whatever it is doing (restoring,
    /// replaying, or serving already).
    pub(super) async fn start_and_kill(&self, after: Duration) -> Result<(), String> {
        let (mut child, _) = self.spawn(None)?;
        tokio::time::sleep(after).await;
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!("the server exited while starting: {status}"));
        }
        child.kill().map_err(|e| format!("kill: {e}"))?;
        child.wait().map_err(|e| e.to_string())?;
        Ok(())
    }

    fn spawn(&self, failpoints: Option<&str>) -> Result<(Child, u16), String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("finding a free port: {e}"))?
            .port();
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let _ = writeln!(
            log,
            "=== start, WEIR_FAILPOINTS={}",
            failpoints.unwrap_or("")
        );
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(&self.weir)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--config")
            .arg(&self.config)
            .args(["--streaming-parallelism", "2"])
            .env("WEIR_FAILPOINTS", failpoints.unwrap_or(""))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.weir.display()))?;
        Ok((child, port))
    }
}

async fn answers(port: u16) -> bool {
    let conn = format!("host=127.0.0.1 port={port} user=weir dbname=weir");
    let session = async {
        let client = connect(&conn).await.ok()?;
        client.simple_query("SELECT 1").await.ok()
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), session).await,
        Ok(Some(_))
    )
}

fn aborted(status: ExitStatus) -> bool {
    status.signal() == Some(6)
}

impl Server {
    /// The connection string of the server's SQL port, as the superuser `weir`.
    pub(super) fn conn_string(&self) -> String {
        format!("host=127.0.0.1 port={} user=weir dbname=weir", self.port)
    }

    pub(super) async fn connect(&self) -> Result<Client, String> {
        connect(&self.conn_string()).await
    }

    /// How the process ended, if it did (waiting a moment for a dying one to finish).
    pub(super) async fn exited(&mut self) -> Result<Option<Death>, String> {
        for _ in 0..100 {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                return Ok(aborted(status).then_some(Death::Aborted));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(None)
    }

    /// Waits for the process to end by itself for `wait`, then kills it.
    pub(super) async fn wait_or_kill(&mut self, wait: Duration) -> Result<Death, String> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                return match aborted(status) {
                    true => Ok(Death::Aborted),
                    false => Err(format!("the server exited by itself: {status}")),
                };
            }
            if Instant::now() >= deadline {
                self.child.kill().map_err(|e| format!("kill: {e}"))?;
                self.child.wait().map_err(|e| e.to_string())?;
                return Ok(Death::Killed);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A clean shutdown (SIGTERM), which must end with success.
    pub(super) async fn stop(&mut self) -> Result<(), String> {
        // SAFETY: kill(2) on our own child process.
        unsafe { kill(self.child.id() as i32, 15) };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                return match status.success() {
                    true => Ok(()),
                    false => Err(format!("the server's shutdown ended with {status}")),
                };
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return Err("the server did not shut down within 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) fn print_log_tail(log: &Path) {
    let Ok(file) = std::fs::File::open(log) else {
        return;
    };
    let lines: Vec<String> = std::io::BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .collect();
    eprintln!("crash: the last lines of {}:", log.display());
    for line in &lines[lines.len().saturating_sub(40)..] {
        eprintln!("  {line}");
    }
}

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}
