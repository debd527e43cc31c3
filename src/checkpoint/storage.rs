//! Where checkpoints go: an object store named by URL (`checkpoint.storage`). A local directory
//! (`file://`) is written with fsync, so that a checkpoint survives a power loss once its
//! manifest is written.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use datafusion::object_store::local::LocalFileSystem;
use datafusion::object_store::path::Path as ObjectPath;
use datafusion::object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use futures::TryStreamExt;

use crate::error::{Error, ErrorKind, Result};

pub struct Storage {
    store: Arc<dyn ObjectStore>,
    /// The directory behind a `file://` store, whose writes are synced.
    local_root: Option<PathBuf>,
    url: String,
}

fn store_error(what: &str, e: datafusion::object_store::Error) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("checkpoint storage: {what}: {e}"),
    )
}

impl Storage {
    /// Opens the store at `url`: `file:///absolute/path` (created if missing). Other schemes
    /// are refused with a clear message.
    pub fn open(url: &str) -> Result<Storage> {
        let Some(path) = url.strip_prefix("file://") else {
            return Err(Error::new(
                ErrorKind::InvalidParameter,
                format!("checkpoint storage \"{url}\": only file:// URLs are supported so far"),
            ));
        };
        if !path.starts_with('/') {
            return Err(Error::new(
                ErrorKind::InvalidParameter,
                format!("checkpoint storage \"{url}\": a file:// URL needs an absolute path"),
            ));
        }
        std::fs::create_dir_all(path)?;
        let store = LocalFileSystem::new_with_prefix(path)
            .map_err(|e| store_error("cannot open the directory", e))?;
        Ok(Storage {
            store: Arc::new(store),
            local_root: Some(PathBuf::from(path)),
            url: url.to_string(),
        })
    }

    /// A store over any `ObjectStore` (tests wrap one to inject faults).
    pub fn over(store: Arc<dyn ObjectStore>, url: &str) -> Storage {
        Storage {
            store,
            local_root: None,
            url: url.to_string(),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Writes an object whole (atomically: it is never seen half written).
    pub async fn put(&self, name: &str, bytes: Bytes) -> Result<()> {
        self.store
            .put(&ObjectPath::from(name), PutPayload::from(bytes))
            .await
            .map_err(|e| store_error(&format!("cannot write {name}"), e))?;
        if let Some(root) = &self.local_root {
            sync_path(&root.join(name))?;
        }
        Ok(())
    }

    pub async fn get(&self, name: &str) -> Result<Bytes> {
        let got = self
            .store
            .get(&ObjectPath::from(name))
            .await
            .map_err(|e| store_error(&format!("cannot read {name}"), e))?;
        got.bytes()
            .await
            .map_err(|e| store_error(&format!("cannot read {name}"), e))
    }

    /// Deletes an object; one that is already gone is not an error.
    pub async fn delete(&self, name: &str) -> Result<()> {
        match self.store.delete(&ObjectPath::from(name)).await {
            Ok(()) | Err(datafusion::object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_error(&format!("cannot delete {name}"), e)),
        }
    }

    /// Every object under `prefix`, with its size, in name order.
    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>> {
        let mut out: Vec<(String, u64)> = self
            .store
            .list(Some(&ObjectPath::from(prefix)))
            .map_ok(|m| (m.location.to_string(), m.size))
            .try_collect()
            .await
            .map_err(|e| store_error(&format!("cannot list {prefix}"), e))?;
        out.sort();
        Ok(out)
    }
}

/// Syncs a file and the directory that names it.
fn sync_path(path: &Path) -> Result<()> {
    std::fs::File::open(path)?.sync_all()?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
