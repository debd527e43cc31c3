//! The barrier coordinator: injects a barrier into every source every `barrier_interval_ms`
//! (and on demand, for FLUSH and DDL), collects each actor's acknowledgement and seals an
//! epoch in the state store once every actor has acknowledged it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::{mpsc, oneshot, watch, Notify};

use super::message::{ActorId, Barrier, BarrierKind, Feed, FeedPosition, Mutation};
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::state::{Image, StateStore};

/// Epochs injected and not yet sealed, at most. A periodic barrier is not injected past it
/// (the epochs in flight already end soon enough), and barriers asked for wait: so actors that
/// fall behind (a stalled disk) do not pile up barriers in every source's queue.
pub const EPOCHS_IN_FLIGHT_MAX: usize = 32;

/// Actor events waiting for the coordinator, at most; an actor reporting past it waits.
/// Each actor has at most one acknowledgement per epoch in flight and one exit to report.
const EVENTS_MAX: usize = 4096;

/// What actors report to the coordinator.
#[derive(Debug)]
pub enum ActorEvent {
    Ack {
        actor: ActorId,
        epoch: u64,
    },
    /// The actor ended; `error` says why if it failed.
    Exited {
        actor: ActorId,
        error: Option<Error>,
    },
}

/// A request to inject a barrier now, optionally changing the dataflow at it.
pub struct InjectRequest {
    pub mutation: Option<Arc<Mutation>>,
    /// Actors that start at this barrier: they receive it and must acknowledge it.
    pub add_actors: Vec<ActorId>,
    /// New sources (tables): their feed channel receives this barrier and all later ones.
    pub add_sources: Vec<(ActorId, Feed)>,
    /// Makes the barrier a checkpoint barrier: the state store's checkpoint is taken into
    /// this directory once every actor has committed the epoch, before it is sealed.
    pub snapshot: Option<SnapshotRequest>,
    reply: oneshot::Sender<u64>,
}

pub struct SnapshotRequest {
    pub dir: PathBuf,
    /// Asks for the epoch's writes since the previous checkpoint rather than a RocksDB
    /// checkpoint, when the store kept them all (`StateStore::checkpoint`).
    pub delta: bool,
    pub reply: oneshot::Sender<Result<TakenSnapshot>>,
}

/// Each source's position (by its actor) in the newest durable checkpoint.
pub type DurableSplits = Arc<BTreeMap<ActorId, BTreeMap<String, serde_json::Value>>>;

/// A checkpoint of the state at the end of one epoch.
#[derive(Debug)]
pub struct TakenSnapshot {
    pub epoch: u64,
    pub image: Image,
    /// From the barrier's injection until every actor had committed its epoch.
    pub align: Duration,
    /// Flushing and linking the files.
    pub snapshot: Duration,
    /// Each source's offset at the epoch: the statements it had fed before the barrier.
    pub offsets: BTreeMap<ActorId, u64>,
    /// Each source's last watermark value sent before the barrier, where it sent one.
    pub watermarks: BTreeMap<ActorId, i64>,
    /// Where each source's connector resumes after the rows before the barrier, where it
    /// keeps its own position (`message::Splits`).
    pub splits: BTreeMap<ActorId, BTreeMap<String, serde_json::Value>>,
}

/// A snapshot the coordinator took off its own task, coming back to be sealed.
struct SnapshotDone {
    epoch: u64,
    result: Result<Image>,
    align: Duration,
    snapshot: Duration,
    reply: oneshot::Sender<Result<TakenSnapshot>>,
}

/// Actors whose task ended with an error, and why. A view whose actor failed can no longer
/// be read.
pub type FailedActors = Arc<Mutex<HashMap<ActorId, Error>>>;

/// Writes acknowledged to clients, and how many of them sealed epochs hold: what a read that
/// must see every write acknowledged before it waits for (`BarrierClient::read_fence`,
/// `docs/design/0010-transactions.md`).
struct Writes {
    /// Counted once a write is in its table's feed, before it is acknowledged.
    acknowledged: AtomicU64,
    /// The count when the newest barrier was injected: its epoch holds at least those.
    injected: AtomicU64,
    /// The count the last sealed epoch holds at least.
    sealed: watch::Sender<u64>,
    /// Asks the coordinator for a barrier now. Readers that ask together take one permit:
    /// one barrier serves them all.
    wanted: Notify,
}

/// Raises `watch` to `to`, telling its receivers only when it rose.
fn raise(watch: &watch::Sender<u64>, to: u64) {
    watch.send_if_modified(|v| {
        let rose = to > *v;
        *v = (*v).max(to);
        rose
    });
}

/// The handle sessions use to talk to the coordinator.
#[derive(Clone)]
pub struct BarrierClient {
    requests: mpsc::Sender<InjectRequest>,
    store: Arc<StateStore>,
    writes: Arc<Writes>,
    pub failed: FailedActors,
    /// The epoch of the newest checkpoint whose manifest is durable, for sinks to commit.
    durable: Arc<watch::Sender<u64>>,
    /// The sources' positions in that checkpoint, for connectors that tell their upstream
    /// how far Weir has durably read (a Kafka consumer group's offsets).
    durable_splits: Arc<watch::Sender<DurableSplits>>,
    /// The server's metrics, which the coordinator and the checkpointer record.
    pub metrics: Arc<Metrics>,
}

impl BarrierClient {
    /// The checkpoint of `epoch` is durable (its manifest is in the store), with the sources'
    /// positions `splits`: sinks may commit what they pre-committed up to it, and sources may
    /// tell their upstream.
    pub fn checkpoint_durable(&self, epoch: u64, splits: DurableSplits) {
        raise(&self.durable, epoch);
        self.durable_splits.send_replace(splits);
    }

    /// Follows the sources' positions of `checkpoint_durable`.
    pub fn durable_splits(&self) -> watch::Receiver<DurableSplits> {
        self.durable_splits.subscribe()
    }

    /// Follows `checkpoint_durable`.
    pub fn durable(&self) -> watch::Receiver<u64> {
        self.durable.subscribe()
    }

    /// Injects a barrier carrying `mutation` and returns its epoch (not yet sealed).
    pub async fn inject(
        &self,
        mutation: Option<Mutation>,
        add_actors: Vec<ActorId>,
        add_sources: Vec<(ActorId, Feed)>,
    ) -> Result<u64> {
        self.request(mutation, add_actors, add_sources, None).await
    }

    /// Injects a checkpoint barrier whose snapshot goes into `dir` (or is a delta, see
    /// [`SnapshotRequest::delta`]); the receiver gets the snapshot once taken (the epoch is
    /// sealed right after).
    pub async fn checkpoint_barrier(
        &self,
        dir: PathBuf,
        delta: bool,
    ) -> Result<oneshot::Receiver<Result<TakenSnapshot>>> {
        let (reply, rx) = oneshot::channel();
        let snapshot = SnapshotRequest { dir, delta, reply };
        self.request(None, vec![], vec![], Some(snapshot)).await?;
        Ok(rx)
    }

    /// What the state store keeps of the writes between checkpoints for deltas
    /// (`StateStore::keep_changes`).
    pub fn keep_changes(&self, keep: crate::state::Keep) {
        self.store.keep_changes(keep);
    }

    /// The state's size (`StateStore::size_bytes`).
    pub fn state_bytes(&self) -> u64 {
        self.store.size_bytes()
    }

    async fn request(
        &self,
        mutation: Option<Mutation>,
        add_actors: Vec<ActorId>,
        add_sources: Vec<(ActorId, Feed)>,
        snapshot: Option<SnapshotRequest>,
    ) -> Result<u64> {
        let (reply, rx) = oneshot::channel();
        let req = InjectRequest {
            mutation: mutation.map(Arc::new),
            add_actors,
            add_sources,
            snapshot,
            reply,
        };
        self.requests
            .send(req)
            .await
            .map_err(|_| Error::unavailable("the server is shutting down"))?;
        rx.await
            .map_err(|_| Error::unavailable("the server is shutting down"))
    }

    /// The state at the last sealed epoch, held or not (`StateStore::sealed_snapshot`).
    pub fn sealed_snapshot(&self) -> Arc<crate::state::Snapshot> {
        self.store.sealed_snapshot()
    }

    /// Keeps readers at the epoch sealed now until the hold is dropped (`StateStore::hold`):
    /// a statement applied over several epochs. Readers that must see a write not sealed
    /// before it wait for its end (`read_fence`): the hold is marked with the writes counted
    /// sealed now, which the epoch it keeps holds (the count follows the seal).
    pub fn hold(&self) -> crate::state::Hold {
        self.store.hold(*self.writes.sealed.borrow())
    }

    /// Waits until `epoch` is sealed: visible to every reader.
    pub async fn wait_sealed(&self, epoch: u64) -> Result<()> {
        self.store.wait_sealed(epoch).await
    }

    /// Counts a write that is in its table's feed, about to be acknowledged.
    pub fn wrote(&self) {
        self.writes.acknowledged.fetch_add(1, Ordering::SeqCst);
    }

    /// Waits until every write acknowledged before the call, by any session, is in a sealed
    /// epoch that readers see. At once when none came since the last seal; otherwise through
    /// the next barrier, asked for now unless one already injected holds them, and shared by
    /// every reader waiting for it. While a statement applied across epochs holds readers
    /// back, writes that were not sealed when it began are seen with it, at its end.
    pub async fn read_fence(&self) -> Result<()> {
        let writes = &self.writes;
        let wanted = writes.acknowledged.load(Ordering::SeqCst);
        let mut sealed = writes.sealed.subscribe();
        if *sealed.borrow() < wanted {
            if writes.injected.load(Ordering::SeqCst) < wanted {
                writes.wanted.notify_one();
            }
            sealed
                .wait_for(|s| *s >= wanted)
                .await
                .map_err(|_| Error::unavailable("the barrier coordinator has stopped"))?;
        }
        drop(sealed);
        if self.store.held_since().is_some_and(|mark| wanted > mark) {
            self.store.wait_visible(self.store.sealed_epoch()).await?;
        }
        Ok(())
    }

    /// Injects a barrier and waits until it is sealed (held from readers or not).
    pub async fn flush(&self) -> Result<u64> {
        let epoch = self.inject(None, vec![], vec![]).await?;
        self.wait_sealed(epoch).await?;
        Ok(epoch)
    }

    /// Injects a barrier and waits until readers see it: every change acknowledged before the
    /// call is then visible in every view.
    pub async fn flush_visible(&self) -> Result<u64> {
        let epoch = self.flush().await?;
        self.store.wait_visible(epoch).await?;
        Ok(epoch)
    }

    /// Waits until readers see `epoch` (or a later one).
    pub async fn wait_visible(&self, epoch: u64) -> Result<()> {
        self.store.wait_visible(epoch).await
    }
}

pub struct Coordinator {
    store: Arc<StateStore>,
    requests: mpsc::Receiver<InjectRequest>,
    events: mpsc::Receiver<ActorEvent>,
    /// Per source, the queue its injector task forwards into the source's feed channel, so
    /// the coordinator never waits on a full channel. Each barrier queued is of an epoch in
    /// flight, so `EPOCHS_IN_FLIGHT_MAX` of them fit.
    sources: HashMap<ActorId, mpsc::Sender<Barrier>>,
    actors: HashSet<ActorId>,
    /// Actors yet to acknowledge each epoch in flight.
    in_flight: BTreeMap<u64, HashSet<ActorId>>,
    last_epoch: u64,
    barrier_interval: Duration,
    clock: Arc<dyn Clock>,
    last_time_us: i64,
    failed: FailedActors,
    /// Checkpoint barriers in flight, by epoch, with when they were injected.
    snapshots: HashMap<u64, (SnapshotRequest, Instant)>,
    /// The epoch whose snapshot is being taken: no epoch seals until it is done.
    snapshotting: Option<u64>,
    /// One snapshot is taken at a time.
    snapshot_done: (mpsc::Sender<SnapshotDone>, mpsc::Receiver<SnapshotDone>),
    /// When each epoch in flight was injected, for the barrier latency metric.
    injected_at: BTreeMap<u64, Instant>,
    /// Sources' positions at each barrier not yet sealed, recorded by their injectors as they
    /// send it.
    positions: Arc<Mutex<BTreeMap<u64, BTreeMap<ActorId, FeedPosition>>>>,
    /// Each source's position at the last epoch its actor committed (its start before the
    /// first): where the state of a source whose actor failed ends.
    committed: HashMap<ActorId, FeedPosition>,
    metrics: Arc<Metrics>,
    writes: Arc<Writes>,
    /// The acknowledged writes counted when each epoch in flight was injected.
    covers: BTreeMap<u64, u64>,
}

impl Coordinator {
    /// Starts the coordinator task. Returns the client handle and the sender actors report to.
    pub fn start(
        store: Arc<StateStore>,
        barrier_interval: Duration,
        clock: Arc<dyn Clock>,
    ) -> (BarrierClient, mpsc::Sender<ActorEvent>) {
        let metrics = Arc::new(Metrics::default());
        let (req_tx, req_rx) = mpsc::channel(64);
        let (ev_tx, ev_rx) = mpsc::channel(EVENTS_MAX);
        let failed: FailedActors = Arc::default();
        let last_epoch = store.sealed_epoch();
        let writes = Arc::new(Writes {
            acknowledged: AtomicU64::new(0),
            injected: AtomicU64::new(0),
            sealed: watch::channel(0).0,
            wanted: Notify::new(),
        });
        let coordinator = Coordinator {
            store: store.clone(),
            requests: req_rx,
            events: ev_rx,
            sources: HashMap::new(),
            actors: HashSet::new(),
            in_flight: BTreeMap::new(),
            last_epoch,
            barrier_interval,
            clock,
            last_time_us: i64::MIN,
            failed: failed.clone(),
            snapshots: HashMap::new(),
            snapshotting: None,
            snapshot_done: mpsc::channel(1),
            injected_at: BTreeMap::new(),
            positions: Arc::default(),
            committed: HashMap::new(),
            metrics: metrics.clone(),
            writes: writes.clone(),
            covers: BTreeMap::new(),
        };
        tokio::spawn(coordinator.run());
        (
            BarrierClient {
                requests: req_tx,
                store,
                writes,
                failed,
                durable: Arc::new(watch::channel(0).0),
                durable_splits: Arc::new(watch::channel(DurableSplits::default()).0),
                metrics,
            },
            ev_tx,
        )
    }

    async fn run(mut self) {
        let mut ticker = tokio::time::interval(self.barrier_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let writes = self.writes.clone();
        let store = self.store.clone();
        loop {
            // In this order: what actors report first (acks seal epochs and free room), then
            // barriers asked for, which come before the periodic ones whenever room frees up
            // (a tick that would always be ready must not hold the others back).
            tokio::select! {
                biased;
                ev = self.events.recv() => {
                    let Some(ev) = ev else { return };
                    self.on_event(ev);
                }
                done = self.snapshot_done.1.recv() => {
                    let Some(done) = done else { return };
                    self.on_snapshot(done);
                }
                req = self.requests.recv(), if self.in_flight.len() < EPOCHS_IN_FLIGHT_MAX => {
                    let Some(req) = req else { return };
                    let epoch =
                        self.inject(req.mutation, req.add_actors, req.add_sources, req.snapshot);
                    let _ = req.reply.send(epoch);
                }
                // A reader waits for writes no barrier in flight holds (its permit stays
                // until the epochs in flight leave room).
                _ = writes.wanted.notified(), if self.in_flight.len() < EPOCHS_IN_FLIGHT_MAX => {
                    self.inject(None, vec![], vec![], None);
                }
                // Operators' caches or their epoch's writes passed their share: a barrier
                // flushes the writes and lets the caches empty. One at a time: the next is
                // asked for once it is sealed, if they are still over.
                _ = store.share_passed().notified(), if self.in_flight.is_empty() => {
                    if store.over_shares() {
                        self.inject(None, vec![], vec![], None);
                    }
                }
                _ = ticker.tick() => {
                    if self.in_flight.len() < EPOCHS_IN_FLIGHT_MAX {
                        self.inject(None, vec![], vec![], None);
                    }
                }
            }
        }
    }

    fn inject(
        &mut self,
        mutation: Option<Arc<Mutation>>,
        add_actors: Vec<ActorId>,
        add_sources: Vec<(ActorId, Feed)>,
        snapshot: Option<SnapshotRequest>,
    ) -> u64 {
        self.last_epoch += 1;
        let epoch = self.last_epoch;
        // Read before the barrier goes into any feed: every write counted by now is in its
        // feed ahead of it.
        let acknowledged = self.writes.acknowledged.load(Ordering::SeqCst);
        self.covers.insert(epoch, acknowledged);
        self.writes.injected.store(acknowledged, Ordering::SeqCst);
        for (id, feed) in add_sources {
            let (tx, mut rx) = mpsc::channel::<Barrier>(EPOCHS_IN_FLIGHT_MAX);
            let positions = self.positions.clone();
            self.committed.insert(id, feed.start.clone());
            tokio::spawn(async move {
                while let Some(b) = rx.recv().await {
                    let epoch = b.epoch;
                    // Recorded before the barrier goes in, so before the source's actor can
                    // acknowledge it.
                    let record = |position| {
                        positions
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .entry(epoch)
                            .or_default()
                            .insert(id, position);
                    };
                    if feed.send_barrier(b, record).await.is_err() {
                        break;
                    }
                }
            });
            self.sources.insert(id, tx);
        }
        self.actors.extend(add_actors);
        // Barrier time never goes back, even if the clock does.
        self.last_time_us = self.last_time_us.max(self.clock.now_us());
        let barrier = Barrier {
            epoch,
            time_us: self.last_time_us,
            kind: if snapshot.is_some() {
                BarrierKind::Checkpoint
            } else {
                BarrierKind::Regular
            },
            mutation: mutation.clone(),
        };
        if let Some(request) = snapshot {
            self.snapshots
                .insert(epoch, (request, crate::clock::monotonic()));
        }
        for tx in self.sources.values() {
            // A closed queue is a source whose actor is gone (its exit is on the way).
            let full = matches!(
                tx.try_send(barrier.clone()),
                Err(mpsc::error::TrySendError::Full(_))
            );
            assert!(
                !full,
                "a source's barrier queue outgrew the epochs in flight"
            );
        }
        self.in_flight.insert(epoch, self.actors.clone());
        self.injected_at.insert(epoch, crate::clock::monotonic());
        if let Some(m) = &mutation {
            // Stopped actors still acknowledge this barrier, but no later one.
            for id in &m.stop {
                self.actors.remove(id);
                self.sources.remove(id);
                self.committed.remove(id);
            }
        }
        self.count_actors();
        self.try_seal();
        epoch
    }

    fn count_actors(&self) {
        self.metrics
            .dataflow_actors
            .store(self.actors.len() as u64, Ordering::Relaxed);
    }

    fn on_event(&mut self, ev: ActorEvent) {
        match ev {
            ActorEvent::Ack { actor, epoch } => {
                if let Some(waiting) = self.in_flight.get_mut(&epoch) {
                    waiting.remove(&actor);
                }
                // An actor acknowledges an epoch once its writes for it are committed.
                if let Some(committed) = self.committed.get_mut(&actor) {
                    let positions = self.positions.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(p) = positions.get(&epoch).and_then(|p| p.get(&actor)) {
                        *committed = p.clone();
                    }
                }
            }
            ActorEvent::Exited { actor, error } => {
                self.actors.remove(&actor);
                self.count_actors();
                self.sources.remove(&actor);
                if error.is_none() {
                    self.committed.remove(&actor);
                }
                for waiting in self.in_flight.values_mut() {
                    waiting.remove(&actor);
                }
                if let Some(e) = error {
                    self.failed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(actor, e);
                }
            }
        }
        self.try_seal();
    }

    fn try_seal(&mut self) {
        while let Some(entry) = self.in_flight.first_entry() {
            if !entry.get().is_empty() || self.snapshotting.is_some() {
                break;
            }
            let epoch = *entry.key();
            if let Some((request, injected)) = self.snapshots.remove(&epoch) {
                // Every actor has committed the epoch and none of the next can commit before
                // it is sealed: the store holds exactly this epoch's state. Flushing and
                // linking block, so they run off this task; the seal follows.
                self.snapshotting = Some(epoch);
                let store = self.store.clone();
                let done = self.snapshot_done.0.clone();
                let align = injected.elapsed();
                tokio::task::spawn_blocking(move || {
                    let started = crate::clock::monotonic();
                    let result = store.checkpoint(&request.dir, request.delta);
                    // The only snapshot taken: the channel has room for it.
                    let _ = done.blocking_send(SnapshotDone {
                        epoch,
                        result,
                        align,
                        snapshot: started.elapsed(),
                        reply: request.reply,
                    });
                });
                break;
            }
            entry.remove();
            self.seal(epoch);
        }
    }

    fn seal(&mut self, epoch: u64) {
        self.store.seal(epoch);
        // Epochs seal in order: this one holds every write its injection counted.
        let later = self.covers.split_off(&(epoch + 1));
        if let Some(held) = std::mem::replace(&mut self.covers, later)
            .into_values()
            .max()
        {
            raise(&self.writes.sealed, held);
        }
        // Every actor has acknowledged the epoch, or is gone.
        self.positions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|e, _| *e > epoch);
        if let Some(at) = self.injected_at.remove(&epoch) {
            self.metrics.barrier_latency.observe(at.elapsed());
        }
    }

    fn on_snapshot(&mut self, done: SnapshotDone) {
        self.snapshotting = None;
        self.in_flight.remove(&done.epoch);
        let mut positions = self
            .positions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&done.epoch)
            .unwrap_or_default();
        // A source whose actor failed is recorded where its state ends, so that a restore
        // replays what came after (and a table's log is never truncated past it).
        for id in self.failed.lock().unwrap_or_else(|p| p.into_inner()).keys() {
            if let Some(committed) = self.committed.get(id) {
                positions.insert(*id, committed.clone());
            }
        }
        self.seal(done.epoch);
        let taken = done.result.map(|image| TakenSnapshot {
            epoch: done.epoch,
            image,
            align: done.align,
            snapshot: done.snapshot,
            offsets: positions.iter().map(|(id, p)| (*id, p.offset)).collect(),
            watermarks: positions
                .iter()
                .filter_map(|(id, p)| p.watermark.map(|w| (*id, w)))
                .collect(),
            splits: positions
                .iter()
                .filter_map(|(id, p)| p.splits.as_ref().map(|s| (*id, s.as_ref().clone())))
                .collect(),
        });
        let _ = done.reply.send(taken);
        self.try_seal();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    type Started = (
        tempfile::TempDir,
        Arc<StateStore>,
        BarrierClient,
        mpsc::Sender<ActorEvent>,
    );

    /// A coordinator whose periodic barriers never fire during the test.
    fn start() -> Started {
        start_ticking(Duration::from_secs(3600))
    }

    /// A coordinator injecting a periodic barrier every `interval`.
    fn start_ticking(interval: Duration) -> Started {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open_fresh(dir.path()).unwrap();
        let (client, events) = Coordinator::start(
            store.clone(),
            interval,
            Arc::new(crate::clock::ManualClock::new(0)),
        );
        (dir, store, client, events)
    }

    #[tokio::test]
    async fn an_epoch_seals_only_when_every_actor_acknowledged_it() {
        let (_dir, store, client, events) = start();
        // The first tick of the interval injects epoch 1 at once, with no actors.
        client.wait_sealed(1).await.unwrap();
        let e = client.inject(None, vec![7, 8], vec![]).await.unwrap();
        events
            .send(ActorEvent::Ack { actor: 7, epoch: e })
            .await
            .unwrap();
        let waiting = client.wait_sealed(e);
        tokio::pin!(waiting);
        tokio::task::yield_now().await;
        assert!(
            (&mut waiting).now_or_never().is_none(),
            "actor 8 has not acknowledged"
        );
        events
            .send(ActorEvent::Ack { actor: 8, epoch: e })
            .await
            .unwrap();
        waiting.await.unwrap();
        assert_eq!(store.sealed_epoch(), e);
    }

    #[tokio::test]
    async fn an_actor_that_exits_no_longer_holds_epochs_back() {
        let (_dir, store, client, events) = start();
        client.wait_sealed(1).await.unwrap();
        let e = client.inject(None, vec![7], vec![]).await.unwrap();
        events
            .send(ActorEvent::Exited {
                actor: 7,
                error: Some(Error::internal("boom")),
            })
            .await
            .unwrap();
        client.wait_sealed(e).await.unwrap();
        assert_eq!(store.sealed_epoch(), e);
        assert_eq!(
            client
                .failed
                .lock()
                .unwrap()
                .get(&7)
                .map(|e| e.message.as_str()),
            Some("boom")
        );
        // Later epochs no longer wait for it.
        let next = client.flush().await.unwrap();
        assert!(next > e);
    }

    #[tokio::test]
    async fn an_actor_that_falls_behind_holds_back_at_most_the_epochs_in_flight() {
        let (_dir, store, client, events) = start_ticking(Duration::from_millis(1));
        let first = client.inject(None, vec![7], vec![]).await.unwrap();
        // Far more ticks than it takes to fill the epochs in flight.
        tokio::time::sleep(Duration::from_millis(60 * EPOCHS_IN_FLIGHT_MAX as u64)).await;
        let asked = client.inject(None, vec![], vec![]);
        tokio::pin!(asked);
        tokio::task::yield_now().await;
        assert!(
            (&mut asked).now_or_never().is_none(),
            "a barrier asked for waits while the epochs in flight are at their limit"
        );
        // The periodic barriers stopped at the limit: acknowledging that many epochs seals
        // them all, and the barrier asked for comes next (the epochs before `first` had no
        // actor to wait for and sealed at once).
        let last = first + EPOCHS_IN_FLIGHT_MAX as u64 - 1;
        for epoch in first..=last {
            events
                .send(ActorEvent::Ack { actor: 7, epoch })
                .await
                .unwrap();
        }
        client.wait_sealed(last).await.unwrap();
        assert_eq!(store.sealed_epoch(), last);
        assert_eq!(asked.await.unwrap(), last + 1);
    }
}
