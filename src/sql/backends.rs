//! The server's sessions as `pg_stat_activity` shows them (each one's process id, user,
//! client and what it is doing), the signals `pg_cancel_backend` and `pg_terminate_backend`
//! send them, and a session's settings, which carry its backend into every query it runs.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

use crate::clock::{Clock, SystemClock};

/// Every session of the server, by process id.
#[derive(Debug, Default)]
pub struct Backends {
    sessions: Mutex<BTreeMap<i32, Arc<Backend>>>,
}

/// Who a session is: fixed at its start.
#[derive(Debug, Clone)]
pub struct BackendStart {
    pub pid: i32,
    pub user: String,
    pub application_name: String,
    pub client: SocketAddr,
}

/// One session: who it is, what it is doing, and the signals that stop it.
#[derive(Debug)]
pub struct Backend {
    pub start: BackendStart,
    /// When the session started, in microseconds since the epoch.
    pub started_us: i64,
    activity: Mutex<Activity>,
    /// Signalled by a CancelRequest, `pg_cancel_backend` or `pg_terminate_backend`: the
    /// session's running statement stops, if it can be stopped.
    pub cancel: Arc<Notify>,
    /// Set by `pg_terminate_backend`: the session ends once its statement has stopped.
    terminating: AtomicBool,
    /// Signalled with `terminating`, for a session waiting for its client's next message.
    terminate: Notify,
    /// Set once the session's client has been told that it is terminated (57P01).
    told: AtomicBool,
    /// `idle_in_transaction_session_timeout` in milliseconds (0: none), as the session last
    /// set it.
    idle_in_transaction_ms: AtomicU64,
    /// The memory and CPU time its statements use.
    pub usage: Arc<super::usage::Usage>,
    registry: Weak<Backends>,
}

/// What a session is doing, as `pg_stat_activity` shows it.
#[derive(Debug, Clone)]
pub struct Activity {
    pub state: BackendState,
    /// The statement it runs, or ran last.
    pub query: String,
    pub application_name: String,
    /// When that statement started (microseconds since the epoch).
    pub query_start_us: Option<i64>,
    /// When its transaction (its block, or its statement outside one) started.
    pub xact_start_us: Option<i64>,
    /// When `state` last changed.
    pub state_change_us: i64,
}

/// `pg_stat_activity.state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendState {
    Active,
    Idle,
    IdleInTransaction,
    IdleInFailedTransaction,
}

impl BackendState {
    pub fn name(self) -> &'static str {
        match self {
            BackendState::Active => "active",
            BackendState::Idle => "idle",
            BackendState::IdleInTransaction => "idle in transaction",
            BackendState::IdleInFailedTransaction => "idle in transaction (aborted)",
        }
    }
}

/// A session's place in [`Backends`], which it leaves when this is dropped.
#[derive(Debug)]
pub struct Registered(pub Arc<Backend>);

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(registry) = self.0.registry.upgrade() {
            (registry.sessions.lock().unwrap_or_else(|p| p.into_inner())).remove(&self.0.start.pid);
        }
    }
}

fn now_us() -> i64 {
    SystemClock.now_us()
}

impl Backends {
    /// Adds a session under `start.pid`, which no other session has.
    pub fn register(self: &Arc<Self>, start: BackendStart) -> Registered {
        let now = now_us();
        let backend = Arc::new(Backend {
            activity: Mutex::new(Activity {
                state: BackendState::Idle,
                query: String::new(),
                application_name: start.application_name.clone(),
                query_start_us: None,
                xact_start_us: None,
                state_change_us: now,
            }),
            start,
            started_us: now,
            cancel: Arc::new(Notify::new()),
            terminating: AtomicBool::new(false),
            terminate: Notify::new(),
            told: AtomicBool::new(false),
            idle_in_transaction_ms: AtomicU64::new(0),
            usage: Arc::default(),
            registry: Arc::downgrade(self),
        });
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.insert(backend.start.pid, backend.clone());
        Registered(backend)
    }

    pub fn get(&self, pid: i32) -> Option<Arc<Backend>> {
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.get(&pid).cloned()
    }

    /// Every session, in the order of their process ids.
    pub fn list(&self) -> Vec<Arc<Backend>> {
        let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.values().cloned().collect()
    }
}

impl Backend {
    /// Every session of the server this one belongs to.
    pub fn sessions(&self) -> Vec<Arc<Backend>> {
        self.registry
            .upgrade()
            .map(|r| r.list())
            .unwrap_or_default()
    }

    /// The session with process id `pid`, if there is one.
    pub fn session(&self, pid: i32) -> Option<Arc<Backend>> {
        self.registry.upgrade().and_then(|r| r.get(pid))
    }

    pub fn activity(&self) -> Activity {
        self.activity
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The session starts running `query`.
    pub fn running(&self, query: &str) {
        let now = now_us();
        let mut a = self.activity.lock().unwrap_or_else(|p| p.into_inner());
        a.query = crate::sql::shown_statement(query).into_owned();
        a.query_start_us = Some(now);
        a.xact_start_us.get_or_insert(now);
        if a.state != BackendState::Active {
            a.state = BackendState::Active;
            a.state_change_us = now;
        }
    }

    /// The session waits for its client, in `state`.
    pub fn waiting(&self, state: BackendState) {
        let now = now_us();
        let mut a = self.activity.lock().unwrap_or_else(|p| p.into_inner());
        if state == BackendState::Idle {
            a.xact_start_us = None;
        }
        if a.state != state {
            a.state = state;
            a.state_change_us = now;
        }
    }

    /// `SET idle_in_transaction_session_timeout` (0: none).
    pub fn set_idle_in_transaction_timeout(&self, timeout: std::time::Duration) {
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self.idle_in_transaction_ms.store(ms, Ordering::Relaxed);
    }

    /// How long the session may wait idle in a transaction block, if it is bounded.
    pub fn idle_in_transaction_timeout(&self) -> Option<std::time::Duration> {
        match self.idle_in_transaction_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(std::time::Duration::from_millis(ms)),
        }
    }

    /// `SET application_name`.
    pub fn set_application_name(&self, name: &str) {
        let mut a = self.activity.lock().unwrap_or_else(|p| p.into_inner());
        if a.application_name != name {
            a.application_name = name.to_string();
        }
    }

    /// Stops the session's running statement, if it runs one that can be stopped.
    pub fn cancel(&self) {
        self.cancel.notify_waiters();
    }

    /// Ends the session: its running statement stops as a cancelled one does, and then the
    /// connection closes with 57P01.
    pub fn terminate(&self) {
        self.terminating.store(true, Ordering::SeqCst);
        self.cancel.notify_waiters();
        self.terminate.notify_one();
    }

    pub fn terminating(&self) -> bool {
        self.terminating.load(Ordering::SeqCst)
    }

    /// Completes once [`Backend::terminate`] has been called.
    pub async fn terminated(&self) {
        while !self.terminating() {
            self.terminate.notified().await;
        }
    }

    /// Records that the client has been told that the session is terminated; true the first
    /// time only.
    pub fn tell_terminated(&self) -> bool {
        !self.told.swap(true, Ordering::SeqCst)
    }
}

/// A setting's name as PostgreSQL spells it (`SHOW`'s column, `pg_settings.name`), from the
/// lowercase name Weir keeps it under: a few of PostgreSQL's are mixed case.
pub fn setting_name(name: &str) -> &str {
    match name {
        "datestyle" => "DateStyle",
        "intervalstyle" => "IntervalStyle",
        "timezone" => "TimeZone",
        other => other,
    }
}

/// A session's settings (`SET`, `SHOW`, `current_setting`, `pg_settings`), and the session
/// they belong to, which its queries' `pg_backend_pid()` and `pg_stat_activity` read.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    values: HashMap<String, String>,
    /// `None` for what runs on no session's behalf (a view started from the catalog).
    pub backend: Option<Arc<Backend>>,
}

impl Settings {
    pub fn new(values: HashMap<String, String>, backend: Option<Arc<Backend>>) -> Settings {
        Settings { values, backend }
    }
}

impl Settings {
    /// The session's `statement_mem`, in bytes: `None` when it is 0 (or unset), and a
    /// statement's working memory is bounded only by what every statement shares.
    pub fn statement_mem(&self) -> crate::error::Result<Option<usize>> {
        let Some(value) = self.values.get(STATEMENT_MEM) else {
            return Ok(None);
        };
        let bytes = parse_memory(STATEMENT_MEM, value)?;
        Ok((bytes > 0).then(|| usize::try_from(bytes).unwrap_or(usize::MAX)))
    }
}

/// The setting of a statement's share of batch queries' memory.
pub const STATEMENT_MEM: &str = "statement_mem";

/// A memory setting `name` as PostgreSQL reads one (`work_mem`): kilobytes, or a whole
/// number with a unit (`B`, `kB`, `MB`, `GB`, `TB`); 0, or from 64 kB up to 2^31 - 1 kB.
/// Returns bytes.
pub fn parse_memory(name: &str, value: &str) -> crate::error::Result<u64> {
    use crate::error::{Error, ErrorKind};
    let invalid = || {
        Error::new(
            ErrorKind::InvalidParameter,
            format!("invalid value for parameter \"{name}\": \"{value}\""),
        )
        .with_hint("Valid units for this parameter are \"B\", \"kB\", \"MB\", \"GB\", and \"TB\".")
    };
    let text = value.trim();
    let split = (text.find(|c: char| !c.is_ascii_digit())).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| invalid())?;
    let per_unit: u64 = match unit.trim() {
        "B" => 1,
        "" | "kB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        _ => return Err(invalid()),
    };
    let bytes = number.checked_mul(per_unit).ok_or_else(invalid)?;
    let (min, max) = (64u64 << 10, (i32::MAX as u64) << 10);
    if bytes != 0 && !(min..=max).contains(&bytes) {
        return Err(Error::new(
            ErrorKind::InvalidParameter,
            format!(
                "{} kB is outside the valid range for parameter \"{name}\" (64 .. {})",
                bytes >> 10,
                i32::MAX
            ),
        ));
    }
    Ok(bytes)
}

/// `bytes` as PostgreSQL shows a memory setting: in the largest unit that divides it.
pub fn memory_text(bytes: u64) -> String {
    let units = [(40, "TB"), (30, "GB"), (20, "MB"), (10, "kB")];
    match units
        .iter()
        .find(|(shift, _)| bytes != 0 && bytes.is_multiple_of(1u64 << shift))
    {
        Some((shift, unit)) => format!("{}{unit}", bytes >> shift),
        None if bytes == 0 => "0".into(),
        None => format!("{bytes}B"),
    }
}

impl std::ops::Deref for Settings {
    type Target = HashMap<String, String>;

    fn deref(&self) -> &HashMap<String, String> {
        &self.values
    }
}

impl std::ops::DerefMut for Settings {
    fn deref_mut(&mut self) -> &mut HashMap<String, String> {
        &mut self.values
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(pid: i32) -> BackendStart {
        BackendStart {
            pid,
            user: "weir".into(),
            application_name: "psql".into(),
            client: "127.0.0.1:5000".parse().unwrap(),
        }
    }

    #[test]
    fn memory_settings_read_back_as_they_are_shown() {
        for (bytes, text) in [
            (0, "0"),
            (1 << 20, "1MB"),
            (65 << 10, "65kB"),
            (3 << 30, "3GB"),
        ] {
            assert_eq!(memory_text(bytes), text);
            assert_eq!(parse_memory("m", text).unwrap(), bytes);
        }
        assert_eq!(memory_text(100_001), "100001B");
    }

    #[test]
    fn a_session_leaves_the_registry_when_it_ends() {
        let backends = Arc::new(Backends::default());
        let a = backends.register(start(2));
        let b = backends.register(start(1));
        let pids: Vec<i32> = a.0.sessions().iter().map(|s| s.start.pid).collect();
        assert_eq!(pids, vec![1, 2]);
        drop(b);
        assert!(backends.get(1).is_none());
        assert_eq!(a.0.session(2).map(|s| s.start.pid), Some(2));
    }

    #[test]
    fn activity_follows_statements_and_blocks() {
        let backends = Arc::new(Backends::default());
        let s = backends.register(start(7));
        s.0.running("BEGIN");
        let begun = s.0.activity();
        assert_eq!(begun.state, BackendState::Active);
        s.0.waiting(BackendState::IdleInTransaction);
        s.0.running("SELECT 1");
        let a = s.0.activity();
        assert_eq!(a.query, "SELECT 1");
        assert_eq!(a.xact_start_us, begun.xact_start_us, "the block's start");
        s.0.waiting(BackendState::Idle);
        let a = s.0.activity();
        assert_eq!((a.state, a.xact_start_us), (BackendState::Idle, None));
        assert_eq!(a.query, "SELECT 1", "the last statement stays");
    }

    #[tokio::test]
    async fn terminate_wakes_a_waiting_session_and_tells_it_once() {
        let backends = Arc::new(Backends::default());
        let s = backends.register(start(3));
        let backend = s.0.clone();
        let waiting = tokio::spawn(async move { backend.terminated().await });
        s.0.terminate();
        waiting.await.unwrap();
        assert!(s.0.tell_terminated());
        assert!(!s.0.tell_terminated());
    }
}
