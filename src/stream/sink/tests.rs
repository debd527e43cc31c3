//! The sink log and its delivery against a recording target, on a real state store.

use super::*;
use crate::stream::test_util::{chunk, schema};
use datafusion::arrow::datatypes::DataType;
use std::sync::Mutex as StdMutex;

/// A target that records what it is asked, holds what was committed, and fails the commits
/// it is told to.
#[derive(Clone, Default)]
struct Target {
    asked: Arc<StdMutex<Vec<String>>>,
    held: Arc<StdMutex<Option<u64>>>,
    fail_commits: Arc<AtomicU64>,
    /// Commits that land in the target and still report a failure (a commit cut short after
    /// its decision, which the target's next `delivered` finishes).
    land_then_fail: Arc<AtomicU64>,
}

#[async_trait::async_trait]
impl SinkWriter for Target {
    async fn delivered(&mut self) -> Result<Option<u64>> {
        let held = *self.held.lock().unwrap();
        self.asked
            .lock()
            .unwrap()
            .push(format!("delivered {held:?}"));
        Ok(held)
    }
    async fn begin(&mut self, epoch: u64, replace: bool) -> Result<()> {
        let what = if replace { "replace" } else { "begin" };
        self.asked.lock().unwrap().push(format!("{what} {epoch}"));
        Ok(())
    }
    async fn write(&mut self, chunk: StreamChunk) -> Result<()> {
        let ops: Vec<&str> = (chunk.ops.iter())
            .map(|o| if *o == Op::Insert { "+" } else { "-" })
            .collect();
        self.asked
            .lock()
            .unwrap()
            .push(format!("write {}", ops.join("")));
        Ok(())
    }
    async fn commit(&mut self, epoch: u64) -> Result<()> {
        if self.fail_commits.load(Ordering::SeqCst) > 0 {
            self.fail_commits.fetch_sub(1, Ordering::SeqCst);
            self.asked.lock().unwrap().push("commit failed".into());
            return Err(Error::new(
                ErrorKind::ConnectionFailure,
                "the target is gone",
            ));
        }
        *self.held.lock().unwrap() = Some(epoch);
        if self.land_then_fail.load(Ordering::SeqCst) > 0 {
            self.land_then_fail.fetch_sub(1, Ordering::SeqCst);
            self.asked
                .lock()
                .unwrap()
                .push(format!("commit {epoch} landed, failed"));
            return Err(Error::new(ErrorKind::ConnectionFailure, "cut short"));
        }
        self.asked.lock().unwrap().push(format!("commit {epoch}"));
        Ok(())
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    store: Arc<StateStore>,
    durable: watch::Sender<u64>,
    driver: SinkDriver,
    status: Arc<SinkStatus>,
}

const LOG: TableId = 9;

fn fixture(bytes_max: u64) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open_fresh(dir.path()).unwrap();
    let (durable, watching) = watch::channel(0);
    let log = SinkLog::open(store.clone(), LOG, bytes_max, watching).unwrap();
    let status = Arc::new(SinkStatus::default());
    let driver = SinkDriver::new(status.clone(), Some(log));
    Fixture {
        _dir: dir,
        store,
        durable,
        driver,
        status,
    }
}

impl Fixture {
    /// Starts delivering the sink's log to `target`.
    fn deliver(&self, target: &Target, start: SinkStart) -> tokio::task::JoinHandle<()> {
        tokio::spawn(deliver(
            self.store.clone(),
            LOG,
            Box::new(target.clone()),
            self.status.clone(),
            self.durable.subscribe(),
            start,
        ))
    }

    /// The sink's view emits `changes` ("+1 +2 -1": one chunk per group) in epoch `epoch`.
    async fn epoch(&mut self, epoch: u64, changes: &[&str]) {
        let s = schema(&[("a", DataType::Int64)]);
        for c in changes {
            self.driver.write(&chunk(&s, c)).unwrap();
        }
        let mut writes = EpochWrites::default();
        self.driver.on_barrier(epoch, &mut writes).await.unwrap();
        self.store.commit(epoch, writes).await.unwrap();
        self.store.seal(epoch);
    }

    fn entries(&self) -> usize {
        let mut n = 0;
        (self.store.snapshot())
            .scan_table(LOG, &mut |_, _| {
                n += 1;
                true
            })
            .unwrap();
        n
    }
}

async fn until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn each_durable_checkpoint_is_delivered_once_from_the_log_and_then_deleted() {
    let mut f = fixture(u64::MAX);
    f.epoch(1, &["+ 1\n+ 2"]).await;
    f.epoch(2, &["- 1\n+ 3", "+ 4"]).await;
    let target = Target::default();
    let task = f.deliver(&target, SinkStart::Created);
    // Nothing is durable yet: the target is asked what it holds, and nothing is sent.
    until("the target asked", || {
        target.asked.lock().unwrap().len() == 1
    })
    .await;
    f.durable.send_replace(1);
    until("epoch 1", || *target.held.lock().unwrap() == Some(1)).await;
    f.durable.send_replace(2);
    until("epoch 2", || *target.held.lock().unwrap() == Some(2)).await;
    assert_eq!(
        *target.asked.lock().unwrap(),
        [
            "delivered None",
            "begin 1",
            "write ++",
            "commit 1",
            "begin 2",
            "write -++",
            "commit 2"
        ]
    );
    assert_eq!(f.status.sent.load(Ordering::Relaxed), 5);
    assert_eq!(f.status.delivered.load(Ordering::Relaxed), 2);
    // The next barrier deletes what the target holds.
    assert_eq!(f.entries(), 2);
    f.epoch(3, &["+ 5"]).await;
    assert_eq!(f.entries(), 1);
    assert!(f.status.log_bytes.load(Ordering::Relaxed) > 0);
    f.status.stop();
    task.await.unwrap();
}

#[tokio::test]
async fn a_restart_sends_only_the_checkpoints_the_target_lacks_and_a_failure_is_retried() {
    let mut f = fixture(u64::MAX);
    f.epoch(1, &["+ 1"]).await;
    f.epoch(2, &["+ 2"]).await;
    f.epoch(3, &["+ 3"]).await;
    // The target holds checkpoint 1; the server restored checkpoint 3, and no checkpoint
    // since is durable. Its first commit fails after the target took it (a lost reply).
    let target = Target::default();
    *target.held.lock().unwrap() = Some(1);
    target.fail_commits.store(1, Ordering::SeqCst);
    let task = f.deliver(&target, SinkStart::Restored(3));
    until("epoch 3", || *target.held.lock().unwrap() == Some(3)).await;
    assert_eq!(
        *target.asked.lock().unwrap(),
        [
            "delivered Some(1)",
            "begin 3",
            "write +",
            "write +",
            "commit failed",
            "delivered Some(1)",
            "begin 3",
            "write +",
            "write +",
            "commit 3"
        ]
    );
    assert_eq!(f.status.retries.load(Ordering::Relaxed), 0);
    assert_eq!(f.status.error(), None);
    f.status.stop();
    task.await.unwrap();
}

#[tokio::test]
async fn a_target_ahead_of_the_restored_checkpoint_is_an_error_not_a_skip() {
    let mut f = fixture(u64::MAX);
    f.epoch(1, &["+ 1"]).await;
    let target = Target::default();
    *target.held.lock().unwrap() = Some(7);
    let task = f.deliver(&target, SinkStart::Restored(1));
    until("the error", || f.status.error().is_some()).await;
    assert!(f.status.error().unwrap().contains("epoch 7"));
    assert_eq!(target.asked.lock().unwrap()[0], "delivered Some(7)");
    assert!(!target
        .asked
        .lock()
        .unwrap()
        .iter()
        .any(|a| a.starts_with("begin")));
    f.status.stop();
    task.await.unwrap();
}

#[tokio::test]
async fn past_its_bound_the_log_holds_the_barrier_until_the_durable_checkpoints_are_delivered() {
    let mut f = fixture(1);
    f.epoch(1, &["+ 1"]).await;
    // Over the bound, but nothing durable to deliver: the barrier goes on.
    f.epoch(2, &["+ 2"]).await;
    f.durable.send_replace(2);
    let s = schema(&[("a", DataType::Int64)]);
    f.driver.write(&chunk(&s, "+ 3")).unwrap();
    let mut writes = EpochWrites::default();
    let barrier = f.driver.on_barrier(3, &mut writes);
    futures::pin_mut!(barrier);
    // Checkpoint 2 is durable and not delivered: the barrier waits for it.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), barrier.as_mut())
            .await
            .is_err()
    );
    f.status.delivered.store(2, Ordering::Release);
    f.status.changed.notify_waiters();
    tokio::time::timeout(Duration::from_secs(5), barrier)
        .await
        .expect("the barrier goes on once the target holds checkpoint 2")
        .unwrap();
}

#[test]
fn log_values_read_back_as_written() {
    let s = schema(&[("a", DataType::Int64), ("b", DataType::Utf8)]);
    let c = chunk(&s, "+ 1 x\n- 2 y");
    let back = decode(&encode(&c).unwrap()).unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].ops, c.ops);
    assert_eq!(back[0].data, c.data);
}

#[tokio::test]
async fn a_rebuilt_sink_replaces_its_earlier_output_once() {
    let mut f = fixture(u64::MAX);
    // The server restored the checkpoint of epoch 5; the sink's log was lost, and it sends its
    // view's rows anew from there. The target holds its output up to epoch 4.
    f.store.seal(5);
    f.epoch(6, &["+ 1"]).await;
    f.epoch(7, &["+ 2"]).await;
    let target = Target::default();
    *target.held.lock().unwrap() = Some(4);
    let task = f.deliver(&target, SinkStart::Rebuilt(5));
    // The restored checkpoint replaces the earlier output (its share of the log is empty).
    until("epoch 5", || *target.held.lock().unwrap() == Some(5)).await;
    // A failure after that does not replace again.
    target.fail_commits.store(1, Ordering::SeqCst);
    f.durable.send_replace(6);
    until("epoch 6", || *target.held.lock().unwrap() == Some(6)).await;
    f.durable.send_replace(7);
    until("epoch 7", || *target.held.lock().unwrap() == Some(7)).await;
    assert_eq!(
        *target.asked.lock().unwrap(),
        [
            "delivered Some(4)",
            "replace 5",
            "commit 5",
            "begin 6",
            "write +",
            "commit failed",
            "delivered Some(5)",
            "begin 6",
            "write +",
            "commit 6",
            "begin 7",
            "write +",
            "commit 7"
        ]
    );
    f.status.stop();
    task.await.unwrap();
}

#[tokio::test]
async fn a_replacing_delivery_that_landed_before_its_failure_is_not_repeated() {
    let mut f = fixture(u64::MAX);
    f.store.seal(5);
    f.epoch(6, &["+ 1"]).await;
    let target = Target::default();
    *target.held.lock().unwrap() = Some(4);
    target.land_then_fail.store(1, Ordering::SeqCst);
    let task = f.deliver(&target, SinkStart::Rebuilt(5));
    until("epoch 5", || *target.held.lock().unwrap() == Some(5)).await;
    f.durable.send_replace(6);
    until("epoch 6", || *target.held.lock().unwrap() == Some(6)).await;
    // The replacement is in the target: the next delivery adds to it, never replaces it.
    assert_eq!(
        *target.asked.lock().unwrap(),
        [
            "delivered Some(4)",
            "replace 5",
            "commit 5 landed, failed",
            "delivered Some(5)",
            "begin 6",
            "write +",
            "commit 6"
        ]
    );
    f.status.stop();
    task.await.unwrap();
}
