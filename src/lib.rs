//! Weir: a streaming SQL database. Clients speak the Postgres wire protocol; materialized
//! views are maintained incrementally by a dataflow whose state lives in RocksDB.
//!
//! Code map, in the order a statement travels:
//! - [`server`]: the Postgres wire front end (the only user of `pgwire`).
//! - [`session`]: one connection's settings; dispatches each statement.
//! - [`sql`]: parsing, DDL analysis, DataFusion contexts, and the view compiler.
//! - [`db`]: the database: catalog, tables, dataflow; executes statements (`ddl`, `query`),
//!   recovers at start (`recovery`), answers the system tables (`system_tables`), holds the
//!   data directory's lock (`lock`).
//! - [`catalog`]: tables and views, persisted as JSON.
//! - [`table`]: a table's write path (constraint checks, change log, feed).
//! - [`changelog`]: the durable, checksummed change log behind each table.
//! - [`connector`]: `source`, sources' connectors (the Nexmark generator, CSV files) behind one
//!   trait and registry, and the task feeding each into the dataflow; `sink`, sinks'
//!   connectors (blackhole), whose writers a sink's actor drives through the checkpoints'
//!   two-phase commit (`stream::SinkWriter`).
//! - [`stream`]: actors, barriers, alignment, operators.
//! - [`state`]: operator state in RocksDB, one write batch per epoch (the only user of `rocksdb`).
//! - [`types`], [`error`], [`config`]: shared vocabulary; [`clock`]: every clock the server
//!   reads (the dataflow's injectable one among them); [`rng`]: the seeded generator of tests and tools; [`failpoint`]: named places where
//!   tests make the process die.

pub mod admin;
pub mod catalog;
pub mod changelog;
pub mod checkpoint;
pub mod clock;
pub mod config;
pub mod connector;
pub mod db;
pub mod error;
pub mod failpoint;
pub mod metrics;
pub mod rng;
pub mod server;
pub mod session;
pub mod sql;
pub mod state;
pub mod stream;
pub mod table;
pub mod types;

/// The stack of every thread that parses, plans and runs statements (the threads of
/// [`runtime`]): sized so that statements as deep as the parser allows (`DEPTH_MAX` in `sql/parser/limits.rs`) pass
/// every recursive pass, ours and DataFusion's, in debug builds (which need the most). A
/// thread's stack takes memory only as deep as it is used.
pub const STACK_BYTES: usize = 128 << 20;

/// The multi-threaded runtime the server runs on, every thread with [`STACK_BYTES`] of stack.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .thread_stack_size(STACK_BYTES)
        .enable_all()
        .build()
}

/// A runtime of one worker thread per core named `name`, each with [`STACK_BYTES`] of stack:
/// for work kept off the server's runtime (the dataflow's actors, the tasks of batch plans).
pub fn cores_runtime(name: &str) -> std::io::Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .thread_name(name)
        .thread_stack_size(STACK_BYTES)
        .enable_all()
        .build()
}

/// Stops `runtime`, waiting up to `wait` for its tasks, from a thread of its own: tokio
/// refuses to wait for a runtime from within another one's context. `what` names its threads
/// in the warning when they did not stop cleanly.
pub fn stop_runtime(runtime: tokio::runtime::Runtime, wait: std::time::Duration, what: &str) {
    let stopping = std::thread::spawn(move || runtime.shutdown_timeout(wait));
    if stopping.join().is_err() {
        tracing::warn!("{what} did not stop cleanly");
    }
}

/// Set when it is dropped. As the last field of a struct it tells that every field before it
/// has dropped (fields drop in order): a restart in the same process waits on it for files
/// and locks to be released.
#[derive(Debug, Default)]
pub struct DropFlag(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl DropFlag {
    /// A handle that tells, later, whether this flag has been dropped.
    pub fn watch(&self) -> Dropped {
        Dropped(self.0.clone())
    }
}

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// See [`DropFlag::watch`].
#[derive(Debug, Clone)]
pub struct Dropped(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Dropped {
    pub fn is_dropped(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Runs `work`, which blocks its thread (an fsync, a file copy, a RocksDB write), from async
/// code: on the server's runtime the worker hands its other tasks to another thread first, so
/// that a slow disk holds up only the statement that waits for it, never the accept loop,
/// barriers or other clients. Elsewhere (a current-thread runtime, no runtime) it just runs.
pub fn blocking<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

/// Runs future `f` to its end from a thread that may block (a statement's, or an actor's
/// backfill): a connector's checks at CREATE ask its upstream or target, which are async.
pub fn wait<T>(f: impl std::future::Future<Output = T>) -> T {
    blocking(|| tokio::runtime::Handle::current().block_on(f))
}

/// The process's limit on open file descriptors (its soft `RLIMIT_NOFILE`), if known.
pub fn open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the limit into the struct it is given.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    (read && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// Raises the process's soft limit on open file descriptors to its hard limit: a server with
/// many tables, files and connections needs more than the usual soft default of 1,024.
/// Returns the limit before and after.
pub fn raise_open_files_limit() -> Option<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct they are given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return None;
        }
        let before = limit.rlim_cur;
        if limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Some((before, before));
            }
        }
        Some((before, limit.rlim_cur))
    }
}

/// The PostgreSQL version Weir reports (`server_version`): psql picks its catalog queries by it.
pub const PG_VERSION: &str = "15.18";
/// `server_version_num` for [`PG_VERSION`].
pub const PG_VERSION_NUM: &str = "150018";
/// The one database a client can connect to.
pub const DATABASE_NAME: &str = "weir";
