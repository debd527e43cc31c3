//! A throwaway PostgreSQL server: `initdb` into a temporary directory, started on a free
//! loopback port, stopped and deleted on drop. PostgreSQL refuses to run as root, so as root it
//! runs as the `postgres` user. Its WAL carries logical decoding (`wal_level = logical`), so
//! that it can be the upstream of a CDC source too, and connections over TCP authenticate with
//! SCRAM-SHA-256 (the superuser's password is `PASSWORD`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The superuser's password.
pub const PASSWORD: &str = "weir-test";

pub struct Postgres {
    /// Holds the data directory, the socket and the log; deleted on drop.
    dir: tempfile::TempDir,
    bin: PathBuf,
    as_postgres_user: bool,
    /// A libpq connection string for the superuser `postgres`.
    pub conn: String,
}

impl Postgres {
    pub fn start() -> Result<Postgres, String> {
        let bin = server_binaries()?;
        let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
        // The process's own /proc entry belongs to its user.
        let as_postgres_user = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
        if as_postgres_user {
            run(Command::new("chown").arg("postgres").arg(dir.path()))?;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("finding a free port: {e}"))?
            .port();
        let pg = Postgres {
            conn: format!("host=127.0.0.1 port={port} user=postgres password={PASSWORD}"),
            dir,
            bin,
            as_postgres_user,
        };
        let data = pg.dir.path().join("data");
        let password = pg.dir.path().join("password");
        std::fs::write(&password, PASSWORD).map_err(|e| format!("password file: {e}"))?;
        if as_postgres_user {
            run(Command::new("chown").arg("postgres").arg(&password))?;
        }
        pg.run_tool(
            "initdb",
            &[
                "-D",
                &path(&data),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-U",
                "postgres",
                &format!("--pwfile={}", path(&password)),
            ],
        )?;
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c wal_level=logical",
            path(pg.dir.path())
        );
        let log = path(&pg.dir.path().join("log"));
        pg.run_tool(
            "pg_ctl",
            &[
                "-D",
                &path(&data),
                "-w",
                "-l",
                &log,
                "-o",
                &options,
                "start",
            ],
        )?;
        Ok(pg)
    }

    /// Stops the server at once (`-m immediate`, as a crash would: it recovers from its WAL at
    /// the next start) and starts it again on the same port, with the same options.
    #[allow(dead_code)] // tests/postgres_cdc.rs crashes its upstream
    pub fn restart(&self) -> Result<(), String> {
        let data = path(&self.dir.path().join("data"));
        let log = path(&self.dir.path().join("log"));
        // Without -o, pg_ctl starts it with the options it last ran with (postmaster.opts).
        self.run_tool(
            "pg_ctl",
            &["-D", &data, "-m", "immediate", "-w", "-l", &log, "restart"],
        )
    }

    fn run_tool(&self, tool: &str, args: &[&str]) -> Result<(), String> {
        let program = self.bin.join(tool);
        if self.as_postgres_user {
            let line = std::iter::once(path(&program))
                .chain(args.iter().map(|a| a.to_string()))
                .map(|a| shell_quote(&a))
                .collect::<Vec<_>>()
                .join(" ");
            run(Command::new("su").args(["postgres", "-s", "/bin/sh", "-c", &line]))
        } else {
            run(Command::new(program).args(args))
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = path(&self.dir.path().join("data"));
        let _ = self.run_tool("pg_ctl", &["-D", &data, "-m", "immediate", "stop"]);
    }
}

/// The newest installed server's binaries (Debian's layout), or those on the PATH.
fn server_binaries() -> Result<PathBuf, String> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            Some((version, e.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").exists())
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .find(|dir| dir.join("initdb").exists())
        .ok_or_else(|| {
            "PostgreSQL's server binaries (initdb) not found; scripts/deps installs them, or pass --pg".to_string()
        })
}

fn run(command: &mut Command) -> Result<(), String> {
    let out = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
