//! Reading a retained checkpoint's state while the server runs (`SUBSCRIBE ... WITH (since)`):
//! the checkpoint is pinned so that it does not expire while it is read, and its RocksDB
//! directory is rebuilt under `<data>/checkpoints/reads/` as a restore would (files the running
//! store still has are linked, the rest downloaded and checked) and opened for reading, apart
//! from the running store. The directory goes when the reader is dropped, and at the next
//! start after a crash.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{manifest_object, restore, CheckpointClient, Manifest, Record, Status};
use crate::error::{Error, ErrorKind, Result};
use crate::state::Snapshot;

/// How many readers hold each checkpoint, by id.
#[derive(Clone, Default)]
pub(super) struct Pins(Arc<Mutex<BTreeMap<u64, usize>>>);

impl Pins {
    pub(super) fn held(&self) -> MutexGuard<'_, BTreeMap<u64, usize>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A checkpoint held back from expiring until this is dropped.
struct Pin {
    pins: Pins,
    id: u64,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut held = self.pins.held();
        if let Some(n) = held.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.id);
            }
        }
    }
}

/// Where a data directory rebuilds the checkpoints being read.
pub(super) fn reads_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("checkpoints").join("reads")
}

/// A retained checkpoint's state, open for reading; its directory is removed on drop.
pub struct Retained {
    pub manifest: Manifest,
    snapshot: Option<Arc<Snapshot>>,
    dir: PathBuf,
}

impl Retained {
    /// The state at the checkpoint's epoch.
    pub fn snapshot(&self) -> Result<&Arc<Snapshot>> {
        (self.snapshot.as_ref())
            .ok_or_else(|| Error::internal("a checkpoint read before it opened"))
    }
}

impl Drop for Retained {
    fn drop(&mut self) {
        // RocksDB closes with the snapshot's last handle; then its directory can go.
        let snapshot = self.snapshot.take();
        let dir = std::mem::take(&mut self.dir);
        let remove = move || {
            drop(snapshot);
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!("cannot remove {}: {e}", dir.display());
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}

/// The error for an epoch that no retained checkpoint has, naming the ones there are.
fn not_retained(epoch: u64, records: &[Record]) -> Error {
    let mut epochs: Vec<u64> = (records.iter())
        .filter(|r| r.status == Status::Completed)
        .filter_map(|r| r.epoch)
        .collect();
    epochs.sort_unstable();
    let message = match epochs.first() {
        None => format!("no checkpoint is retained, so there is no epoch {epoch} to start from"),
        Some(oldest) if epoch < *oldest => {
            format!("epoch {epoch} is older than the oldest retained checkpoint, at epoch {oldest}")
        }
        Some(_) => {
            let list: Vec<String> = epochs.iter().map(u64::to_string).collect();
            format!(
                "epoch {epoch} is not the epoch of a retained checkpoint: those are at epochs {}",
                list.join(", ")
            )
        }
    };
    Error::new(ErrorKind::InvalidParameter, message).with_hint(
        "SHOW CHECKPOINTS lists the retained checkpoints; [checkpoint] retained keeps more of them.",
    )
}

impl CheckpointClient {
    /// Pins the retained checkpoint of `epoch`: it does not expire until the pin is dropped.
    fn pin(&self, epoch: u64) -> Result<(u64, Pin)> {
        // The checkpointer marks expired checkpoints while it holds the pins, so a completed
        // one found here is not going.
        let mut held = self.pins.held();
        let records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        let Some(id) = (records.iter())
            .find(|r| r.epoch == Some(epoch) && r.status == Status::Completed)
            .map(|r| r.id)
        else {
            return Err(not_retained(epoch, &records));
        };
        *held.entry(id).or_default() += 1;
        let pin = Pin {
            pins: self.pins.clone(),
            id,
        };
        Ok((id, pin))
    }

    /// Opens the state of the retained checkpoint of `epoch` for reading. An epoch that no
    /// retained checkpoint has is refused with 22023, naming the oldest available.
    pub async fn retained(&self, epoch: u64) -> Result<Retained> {
        let (id, _pin) = self.pin(epoch)?;
        let manifest = Manifest::decode(&self.storage.get(&manifest_object(id)).await?)?;
        let dir = reads_dir(&self.data_dir).join(super::random_id());
        let mut retained = Retained {
            manifest,
            snapshot: None,
            dir: dir.clone(),
        };
        let (state, fetched) = (dir.join("state"), dir.join("deltas"));
        let m = &retained.manifest;
        let live = self.data_dir.join("state");
        let mut done = restore::rebuild(&self.storage, m, &live, &state).await?;
        let kept = super::deltas_dir(&self.data_dir);
        let deltas = restore::fetch_deltas(&self.storage, m, &kept, &fetched, &mut done).await?;
        tracing::info!(
            "opened checkpoint {id} (epoch {epoch}) for reading: {} files linked, {} downloaded \
             ({} bytes)",
            done.files_reused,
            done.files_downloaded,
            done.bytes_downloaded
        );
        let opened =
            tokio::task::spawn_blocking(move || Snapshot::open_restored(&state, epoch, &deltas))
                .await
                .map_err(|e| Error::internal(format!("opening a checkpoint: {e}")))??;
        retained.snapshot = Some(opened);
        Ok(retained)
    }
}
