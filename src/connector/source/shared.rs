//! Sources whose one upstream stream feeds several tables (a database's change stream:
//! PostgreSQL CDC, `docs/design/0013-postgres-cdc.md`). Such a source has no rows and no actor
//! of its own: its task reads the stream and feeds the tables attached to it
//! (`CREATE TABLE ... FROM source TABLE '...'`), each through its own feed, every
//! transaction into all of them in one epoch.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::{mpsc, watch};

use super::{Handle, Progress};
use crate::catalog::{ColumnDef, SourceDef};
use crate::error::{Error, Result};
use crate::stream::{DurableSplits, Feed, FeedPosition};

/// A connector's side of a source that feeds tables (`Connector::shared`).
pub trait Shared: Send + Sync {
    /// Checks a table that `CREATE TABLE ... FROM source TABLE 'upstream'` adds to `source`,
    /// with its declared columns and primary key, against the upstream (and makes the upstream
    /// send its changes), and returns the options the table keeps.
    fn create_table(
        &self,
        source: SourceDef,
        upstream: String,
        columns: Vec<ColumnDef>,
        key: Vec<usize>,
    ) -> BoxFuture<'static, Result<BTreeMap<String, String>>>;

    /// The source's task: reads its stream while it runs, for the tables attached to it.
    fn run(&self, source: SourceDef, context: Context) -> BoxFuture<'static, ()>;

    /// Removes what the source made upstream (a replication slot, a publication), once its
    /// task has ended.
    fn drop_source(&self, source: &SourceDef) -> BoxFuture<'static, Result<()>>;
}

/// What a shared source's task is given.
pub struct Context {
    pub progress: Arc<Progress>,
    /// Whether the source runs (it has tables); its sender gone: the source was dropped.
    pub running: watch::Receiver<bool>,
    pub attach: mpsc::Receiver<Attach>,
    /// News of durable checkpoints, with every source's and table's position in them.
    pub durable: watch::Receiver<DurableSplits>,
}

/// A table attached to a shared source's task: the connector's view of it, the feed into its
/// actor, where it starts (a checkpoint's position, or nothing yet), and its progress.
pub struct Attach {
    pub table: SourceDef,
    pub feed: Feed,
    pub start: FeedPosition,
    pub progress: Arc<Progress>,
}

/// Starts a shared source's task, paused until its first table runs it.
pub fn spawn(
    def: SourceDef,
    shared: &'static dyn Shared,
    durable: watch::Receiver<DurableSplits>,
) -> Handle {
    let (running, paused) = watch::channel(false);
    let (attach, attached) = mpsc::channel(16);
    let progress = Arc::new(Progress::default());
    let task = shared.run(
        def.clone(),
        Context {
            progress: progress.clone(),
            running: paused,
            attach: attached,
            durable,
        },
    );
    tokio::spawn(task);
    Handle {
        running,
        progress,
        id: def.id,
        connector: None,
        attach: Some(attach),
        shared: Some((shared, def)),
    }
}

/// Where a shared source's tables attach (`Handle::attacher`), usable without holding the
/// registry of sources.
pub struct Attacher(mpsc::Sender<Attach>);

impl Handle {
    /// Where this shared source's tables attach; for another source, a sender whose task is
    /// gone (attaching fails).
    pub fn attacher(&self) -> Attacher {
        Attacher(self.attach.clone().unwrap_or_else(|| mpsc::channel(1).0))
    }
}

impl Attacher {
    /// Attaches table `table` (its connector's view) to this shared source's task, fed through
    /// `feed` from `start`; returns the table's own handle.
    pub async fn attach(
        &self,
        table: SourceDef,
        feed: Feed,
        start: FeedPosition,
    ) -> Result<Handle> {
        let sender = &self.0;
        let progress = Arc::new(Progress::default());
        let id = table.id;
        sender
            .send(Attach {
                table,
                feed,
                start,
                progress: progress.clone(),
            })
            .await
            .map_err(|_| Error::unavailable("the source's task has stopped"))?;
        // The table runs as long as its source's task does.
        let (running, _) = watch::channel(true);
        Ok(Handle {
            running,
            progress,
            id,
            connector: None,
            attach: None,
            shared: None,
        })
    }
}

impl Handle {
    /// Whether this is a shared source's handle, whose dropping goes upstream too.
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// For a shared source that was dropped: stops its task and removes what it made
    /// upstream. Its handle is gone after.
    pub async fn drop_upstream(self) -> Result<()> {
        let Handle {
            running, shared, ..
        } = self;
        // The task ends when the running flag's sender goes.
        drop(running);
        match shared {
            Some((shared, def)) => shared.drop_source(&def).await,
            None => Ok(()),
        }
    }
}
