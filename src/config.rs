//! Server configuration: embedded defaults, overridden by a TOML file, overridden by flags.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, ErrorKind, Result};

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where the SQL (Postgres wire) listener binds.
    pub listen: SocketAddr,
    /// Catalog, table change logs and operator state live here.
    pub data_dir: PathBuf,
    /// Gone: a start with it set is refused, with a hint to the `[[auth]]` rules that replace
    /// it (it trusted every remote client, whatever user it named).
    pub trust_remote_clients: Option<bool>,
    /// The bootstrap superuser `weir`'s password, set when the first start creates it (or
    /// the `WEIR_SUPERUSER_PASSWORD` environment variable); kept only as a SCRAM verifier.
    pub superuser_password: Option<String>,
    /// The key secrets (`CREATE SECRET`) are encrypted with in the catalog: 64 hexadecimal
    /// digits (or the `WEIR_SECRET_KEY` environment variable). Without one, no secret can be
    /// created, and connectors that name secrets report that they cannot decrypt them.
    pub secret_key: Option<String>,
    /// Keys secrets were encrypted with before `secret_key` replaced them (or
    /// `WEIR_SECRET_KEYS_PREVIOUS`, comma-separated): a start decrypts with them and encrypts
    /// again with the current key.
    pub secret_keys_previous: Vec<String>,
    /// Who may connect from where, and how (`[[auth]]`, pg_hba.conf's rules): the first rule
    /// whose address and user match decides. Without any, `default_auth_rules`.
    pub auth: Vec<AuthRule>,
    /// The directories `file` sources and sinks may use, for every role; without any, only
    /// superusers may name the server's files (`connector/paths.rs`).
    pub allowed_paths: Vec<PathBuf>,
    /// TLS on the SQL port (`[tls]`): off unless a certificate and key are given.
    pub tls: Option<TlsConfig>,
    /// How long a client has to finish its startup (TLS, the startup message, its password)
    /// before it is disconnected (PostgreSQL's `authentication_timeout`).
    pub authentication_timeout_ms: u64,
    /// Connections beyond this many are refused with SQLSTATE 53300.
    pub connections_max: usize,
    /// Of `connections_max`, and of the batch plans that may run at once, this many are kept
    /// for superusers (PostgreSQL's `superuser_reserved_connections`), so that an administrator
    /// can always connect, look and cancel.
    pub superuser_reserved_connections: usize,
    /// The `statement_mem` every session starts with, in bytes (0: a statement is bounded only
    /// by what all statements share). A role's `ALTER ROLE ... SET statement_mem` replaces it
    /// for the role's sessions; either way, only a superuser may raise it.
    pub statement_mem: u64,
    /// Statements longer than this are refused with SQLSTATE 54000.
    pub statement_bytes_max: usize,
    /// A wire-protocol message longer than this ends its connection with SQLSTATE 54000 before
    /// its body is read (PostgreSQL's own limit is 1 GiB, and so is the most this can be).
    pub message_bytes_max: usize,
    /// The memory the server aims to stay within, in bytes; by default half of the physical
    /// memory or the cgroup's limit, whichever is lower. Batch queries together may use half of
    /// it for their working memory (sorts, hash tables, aggregations): past that, an operator
    /// that can spill to disk does, and a query that cannot is refused with 53200.
    pub memory_limit: Option<u64>,
    /// The disk that statements' temporary files may take together, in bytes: what sorts,
    /// aggregations and joins spill past their memory, and the rows of large writes and COPY
    /// spooled before they are logged. By default half of the space free on the data
    /// directory's file system when the server starts, so that the change logs and the state
    /// always keep the other half. Past it, a statement fails with 53400 and its files go.
    pub temp_disk_limit: Option<u64>,
    /// How often the coordinator ends an epoch when nothing else asks for one. Short (100 ms
    /// by default) so that a checkpoint barrier finds little work left: its operators write
    /// what changed since the barrier before it (`docs/design/0026-short-epochs.md`).
    pub barrier_interval_ms: u64,
    /// Capacity (in messages) of each channel between actors.
    pub channel_messages_max: usize,
    /// Distinct rows per chunk when a relation's contents are sent to a new view.
    pub chunk_rows_max: usize,
    /// The most bytes of changes a subscription (`SUBSCRIBE`) holds for a client that has not
    /// read them; past it the subscription ends with SQLSTATE 54000.
    pub subscription_bytes_max: usize,
    /// Parallel actors per view (for views that can be split by key); a session's `SET
    /// streaming_parallelism` overrides it for the views it creates. Default: the cores.
    pub streaming_parallelism: usize,
    /// Whether a session's reads wait until every write acknowledged before them, by any
    /// session, is visible (`read_after_write`, which a session can `SET`).
    pub read_after_write: bool,
    /// The admin HTTP port (checkpoint triggers, `/metrics`); off unless set.
    pub admin_listen: Option<SocketAddr>,
    /// A bearer token that may do everything on the admin port (`Authorization: Bearer ...`).
    pub admin_token: Option<String>,
    /// A bearer token that may only read the admin port (GET).
    pub admin_read_token: Option<String>,
    /// Checkpoints of operator state to an object store (`[checkpoint]` in the TOML file).
    pub checkpoint: CheckpointConfig,
    /// The time barriers carry (what `now()` is in a view's temporal filter); tests inject one.
    #[serde(skip, default = "system_clock")]
    pub clock: Arc<dyn Clock>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Where checkpoints go, as an object store URL: `file:///absolute/path` or
    /// `s3://bucket/prefix`; by default `file://` under the data directory
    /// (`<data_dir>/checkpoint-store`).
    pub storage: Option<String>,
    /// Options of an `s3://` store (`[checkpoint.s3]`), over the `AWS_*` environment variables:
    /// `endpoint`, `region`, `access_key_id`, `secret_access_key`, `allow_http`,
    /// `virtual_hosted_style_request`, ... (object_store's names).
    pub s3: BTreeMap<String, String>,
    /// How often a checkpoint is taken; 0 takes none but those asked for (`CHECKPOINT;`).
    pub interval_ms: u64,
    /// At least this long between the end of one checkpoint and the start of the next.
    pub min_pause_ms: u64,
    /// Completed checkpoints kept; older ones are deleted with the files only they name.
    pub retained: usize,
    /// Upload only the SST files no retained checkpoint holds (false: every file, every time).
    pub incremental: bool,
    /// Most delta checkpoints after a base one: a delta checkpoint uploads only the state's
    /// writes since the previous checkpoint, and a restore ingests every delta since the base
    /// (`docs/design/0003-checkpoints.md`, "Delta checkpoints"); 0 makes every checkpoint a
    /// base one.
    pub max_deltas: usize,
    /// A delta checkpoint's writes are written ahead of it, as SST files of about this many
    /// bytes (before compression), while the epochs come: the checkpoint then writes only
    /// those since the last such part, and its delta is several files. 0 writes each delta
    /// whole at its checkpoint.
    pub delta_part_bytes: usize,
    /// How often the tables' new change-log records are shipped to the store, so that a
    /// restore from the store alone loses only what was acknowledged since; 0 ships none.
    pub ship_logs_ms: u64,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            storage: None,
            s3: BTreeMap::new(),
            interval_ms: 10_000,
            min_pause_ms: 1_000,
            retained: 2,
            incremental: true,
            max_deltas: 600,
            delta_part_bytes: 16 << 20,
            ship_logs_ms: 0,
        }
    }
}

impl Config {
    /// The checkpoint store's URL.
    pub fn checkpoint_storage(&self) -> Result<String> {
        if let Some(url) = &self.checkpoint.storage {
            return Ok(url.clone());
        }
        let dir = self.data_dir.join("checkpoint-store");
        std::fs::create_dir_all(&dir)?;
        let dir = dir.canonicalize()?;
        Ok(format!("file://{}", dir.display()))
    }
}

impl Config {
    /// `memory_limit`, or its default: half of the physical memory or the cgroup's limit,
    /// whichever is lower.
    pub fn memory_limit_bytes(&self) -> u64 {
        self.memory_limit.unwrap_or_else(|| {
            let physical = physical_memory().unwrap_or(4 << 30);
            (physical / 2).min(cgroup_memory_limit().unwrap_or(u64::MAX))
        })
    }
}

impl Config {
    /// `temp_disk_limit`, or its default: half of the space free on the data directory's file
    /// system now (which must exist).
    pub fn temp_disk_limit_bytes(&self) -> Result<u64> {
        if let Some(limit) = self.temp_disk_limit {
            return Ok(limit);
        }
        let free = free_space(&self.data_dir).map_err(|e| {
            Error::io(
                &e,
                format!(
                    "could not read the free space of {}: {e}",
                    self.data_dir.display()
                ),
            )
        })?;
        Ok(free / 2)
    }
}

/// The bytes an unprivileged process may still write to the file system of `path`.
fn free_space(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `stat` a statvfs the call fills in.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// MemTotal from /proc/meminfo.
fn physical_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The memory limit of the process's cgroup (v2 `memory.max`, or v1
/// `memory.limit_in_bytes`), if it has one.
fn cgroup_memory_limit() -> Option<u64> {
    [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|path| std::fs::read_to_string(path).ok()?.trim().parse().ok())
}

fn system_clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 4466)),
            data_dir: PathBuf::from("weir-data"),
            trust_remote_clients: None,
            superuser_password: None,
            secret_key: None,
            secret_keys_previous: Vec::new(),
            auth: Vec::new(),
            tls: None,
            allowed_paths: Vec::new(),
            authentication_timeout_ms: 60_000,
            connections_max: 100,
            superuser_reserved_connections: 3,
            statement_mem: 0,
            statement_bytes_max: 16 * 1024 * 1024,
            message_bytes_max: 64 * 1024 * 1024,
            memory_limit: None,
            temp_disk_limit: None,
            barrier_interval_ms: 100,
            channel_messages_max: 16,
            subscription_bytes_max: 64 << 20,
            chunk_rows_max: 4096,
            streaming_parallelism: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            read_after_write: true,
            admin_listen: None,
            admin_token: None,
            admin_read_token: None,
            checkpoint: CheckpointConfig::default(),
            clock: system_clock(),
        }
    }
}

impl Config {
    /// Reads a TOML file; keys it leaves out keep their defaults.
    pub fn from_file(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::new(
                ErrorKind::InvalidParameter,
                format!("cannot read config file {}: {e}", path.display()),
            )
        })?;
        let config: Config = toml::from_str(&text).map_err(|e| {
            Error::new(
                ErrorKind::InvalidParameter,
                format!("invalid config file {}: {e}", path.display()),
            )
        })?;
        config.check()?;
        Ok(config)
    }

    /// Refuses settings that cannot run: `trust_remote_clients`, rules whose address or
    /// method does not read, a reserve that leaves no connection to others, a `statement_mem`
    /// a session could not set.
    pub fn check(&self) -> Result<()> {
        if self.trust_remote_clients.is_some() {
            return Err(trust_remote_clients_gone());
        }
        if self.superuser_reserved_connections >= self.connections_max {
            return Err(Error::new(
                ErrorKind::InvalidParameter,
                "superuser_reserved_connections must be less than connections_max",
            ));
        }
        crate::sql::parse_memory("statement_mem", &format!("{}B", self.statement_mem))?;
        for rule in &self.auth {
            address_range(&rule.address)?;
        }
        self.secret_keys()?;
        Ok(())
    }

    /// The secret keys of `secret_key` and `secret_keys_previous`.
    pub fn secret_keys(&self) -> Result<crate::catalog::SecretKeys> {
        crate::catalog::SecretKeys::new(self.secret_key.as_deref(), &self.secret_keys_previous)
    }

    /// The rules that decide who connects: the configured ones, or the default ones.
    pub fn auth_rules(&self) -> Vec<AuthRule> {
        match self.auth.is_empty() {
            true => default_auth_rules(),
            false => self.auth.clone(),
        }
    }

    /// The method of the first rule that covers a client at `ip` logging in as `user`, over
    /// TLS or not, whose role has a password or not; `None` when no rule covers it, or when
    /// TLS is required and the client is plaintext.
    pub fn auth_method(
        &self,
        ip: std::net::IpAddr,
        user: &str,
        tls: bool,
        has_password: bool,
    ) -> Option<AuthMethod> {
        if !tls && self.tls.as_ref().is_some_and(|t| t.require) {
            return None;
        }
        let rules = self.auth_rules();
        let rule = rules
            .iter()
            .find(|r| r.covers(ip, user, tls) && !(r.while_passwordless && has_password))?;
        Some(rule.method)
    }
}

/// Why a start with `trust_remote_clients` (or `--trust-remote-clients`) is refused.
pub fn trust_remote_clients_gone() -> Error {
    Error::new(
        ErrorKind::InvalidParameter,
        "trust_remote_clients is no longer supported: clients authenticate",
    )
    .with_hint(
        "To admit remote clients with a password, add to the config file:\n\
         [[auth]]\naddress = \"all\"\nuser = \"all\"\nmethod = \"scram-sha-256\"",
    )
}

/// TLS on the SQL port: the server's certificate chain and private key, as PEM files, read at
/// start. Clients ask for it with an SSLRequest (`sslmode=require`) or open with TLS at once
/// (PostgreSQL 17's `sslnegotiation=direct`, which must name the `postgresql` ALPN protocol).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Refuse clients that do not use TLS (28000, as PostgreSQL without a `host` rule for
    /// them).
    #[serde(default)]
    pub require: bool,
}

/// A rule of who may connect (pg_hba.conf's lines).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthRule {
    /// The client addresses it covers: `loopback`, `all`, an address (`10.1.2.3`) or a range
    /// (`10.0.0.0/8`, `fd00::/8`).
    pub address: String,
    /// The role it covers, or `all`.
    #[serde(default = "all")]
    pub user: String,
    pub method: AuthMethod,
    /// `true`: it covers only connections over TLS (pg_hba.conf's `hostssl`); `false`: only
    /// plaintext ones (`hostnossl`); unset: both (`host`).
    #[serde(default)]
    pub tls: Option<bool>,
    /// The rule covers its role only while the role has no password (the default rule that
    /// trusts the bootstrap superuser from loopback until a password is set for it).
    #[serde(skip)]
    pub while_passwordless: bool,
}

fn all() -> String {
    "all".to_string()
}

/// How a client proves who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthMethod {
    /// No proof.
    Trust,
    /// SCRAM-SHA-256 (SASL).
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
    /// PostgreSQL's `md5`: with passwords kept as SCRAM verifiers, SCRAM-SHA-256, as
    /// PostgreSQL does.
    Md5,
    /// The password in clear text (only sensible over TLS).
    Password,
    /// Refused.
    Reject,
}

/// Without `[[auth]]` rules: the bootstrap superuser is trusted from loopback while it has no
/// password, every other role (and it, once it has one) authenticates with SCRAM-SHA-256
/// from loopback, and nobody connects from elsewhere.
pub fn default_auth_rules() -> Vec<AuthRule> {
    let rule = |user: &str, method, while_passwordless| AuthRule {
        address: "loopback".into(),
        user: user.into(),
        method,
        tls: None,
        while_passwordless,
    };
    vec![
        rule(crate::catalog::BOOTSTRAP_ROLE, AuthMethod::Trust, true),
        rule("all", AuthMethod::ScramSha256, false),
    ]
}

/// What an address spec covers: `None` for every address, else an address and how many of
/// its leading bits must match; `loopback` is both loopback ranges.
fn address_range(spec: &str) -> Result<Vec<Option<(std::net::IpAddr, u8)>>> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let bad = || {
        Error::new(
            ErrorKind::InvalidParameter,
            format!("invalid address in an [[auth]] rule: \"{spec}\""),
        )
        .with_hint("Give loopback, all, an address or a range such as 10.0.0.0/8.")
    };
    Ok(match spec {
        "all" => vec![None],
        "loopback" => vec![
            Some((IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)), 8)),
            Some((IpAddr::V6(Ipv6Addr::LOCALHOST), 128)),
        ],
        _ => {
            let (addr, bits) = match spec.split_once('/') {
                Some((a, b)) => (a, Some(b.parse::<u8>().map_err(|_| bad())?)),
                None => (spec, None),
            };
            let addr: IpAddr = addr.parse().map_err(|_| bad())?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let bits = bits.unwrap_or(max);
            if bits > max {
                return Err(bad());
            }
            vec![Some((addr, bits))]
        }
    })
}

impl AuthRule {
    /// Whether the rule covers a client at `ip` logging in as `user`, over TLS or not.
    pub fn covers(&self, ip: std::net::IpAddr, user: &str, tls: bool) -> bool {
        if self.tls.is_some_and(|t| t != tls) {
            return false;
        }
        let ip = ip.to_canonical();
        let in_range = |(net, bits): (std::net::IpAddr, u8)| match (net, ip) {
            (std::net::IpAddr::V4(n), std::net::IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (std::net::IpAddr::V6(n), std::net::IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        };
        let address = address_range(&self.address)
            .map(|ranges| ranges.into_iter().any(|r| r.is_none_or(in_range)))
            .unwrap_or(false);
        address && (self.user == "all" || self.user == user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_overrides_only_what_it_names() {
        let c: Config =
            toml::from_str("listen = \"127.0.0.1:5555\"\nbarrier_interval_ms = 50").unwrap();
        assert_eq!(c.listen.port(), 5555);
        assert_eq!(c.barrier_interval_ms, 50);
        assert_eq!(c.connections_max, Config::default().connections_max);
        assert!(toml::from_str::<Config>("no_such_key = 1").is_err());
        let c: Config = toml::from_str("[checkpoint]\ninterval_ms = 1000\nretained = 3").unwrap();
        assert_eq!(c.checkpoint.interval_ms, 1000);
        assert_eq!(c.checkpoint.retained, 3);
        assert!(c.checkpoint.incremental);
        let c: Config = toml::from_str(
            "[checkpoint]\nstorage = \"s3://b/p\"\n[checkpoint.s3]\nendpoint = \"http://127.0.0.1:9000\"",
        )
        .unwrap();
        assert_eq!(c.checkpoint.s3["endpoint"], "http://127.0.0.1:9000");
    }

    #[test]
    fn auth_rules_read_and_cover_addresses_and_users_as_pg_hba_does() {
        let c: Config = toml::from_str(
            "[[auth]]\naddress = \"10.0.0.0/8\"\nuser = \"app\"\nmethod = \"password\"\n\
             [[auth]]\naddress = \"all\"\nmethod = \"reject\"",
        )
        .unwrap();
        c.check().unwrap();
        let rules = c.auth_rules();
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert!(rules[0].covers(ip("10.9.8.7"), "app", false));
        assert!(!rules[0].covers(ip("11.0.0.1"), "app", false));
        assert!(!rules[0].covers(ip("10.9.8.7"), "other", false));
        assert!(rules[0].covers(ip("::ffff:10.1.1.1"), "app", false));
        assert!(rules[1].covers(ip("fd00::1"), "anyone", false));
        assert_eq!(rules[1].method, AuthMethod::Reject);
        // hostssl and hostnossl.
        let tls = |t| AuthRule {
            tls: Some(t),
            ..rules[1].clone()
        };
        assert!(tls(true).covers(ip("10.0.0.1"), "a", true));
        assert!(!tls(true).covers(ip("10.0.0.1"), "a", false));
        assert!(tls(false).covers(ip("10.0.0.1"), "a", false));
        assert!(!tls(false).covers(ip("10.0.0.1"), "a", true));
        // The default rules: loopback only.
        let d = default_auth_rules();
        assert!(d[0].covers(ip("127.0.0.1"), "weir", false) && d[0].while_passwordless);
        assert!(!d[0].covers(ip("127.0.0.1"), "app", false));
        assert!(d[1].covers(ip("::1"), "app", false) && d[1].covers(ip("127.1.2.3"), "app", false));
        assert!(!d.iter().any(|r| r.covers(ip("192.168.1.2"), "weir", false)));
        for bad in ["10.0.0.0/33", "::/129", "nowhere", "10.0.0/8"] {
            let c = Config {
                auth: vec![AuthRule {
                    address: bad.into(),
                    ..d[1].clone()
                }],
                ..Config::default()
            };
            assert!(c.check().is_err(), "{bad}");
        }
        assert!(
            toml::from_str::<Config>("[[auth]]\naddress = \"all\"\nmethod = \"ident\"").is_err()
        );
        // The container's configuration admits every client with a password.
        let docker: Config = toml::from_str(include_str!("../docker/weir.toml")).unwrap();
        docker.check().unwrap();
        assert!(docker.auth_rules()[0].covers(ip("203.0.113.9"), "app", false));
        assert_eq!(docker.auth_rules()[0].method, AuthMethod::ScramSha256);
        let gone: Config = toml::from_str("trust_remote_clients = true").unwrap();
        assert!(gone.check().unwrap_err().hint.unwrap().contains("[[auth]]"));
    }
}
