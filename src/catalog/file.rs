//! The catalog's file, `catalog.json` in the data directory: read (refusing encodings newer
//! than this version reads), created with the bootstrap superuser, and written atomically.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use super::{Catalog, Object, Persisted, Verifier, CATALOG_FORMAT, FIRST_USER_ID};
use crate::error::{Error, ErrorKind, Result};

/// The encodings a catalog's data directory (and a checkpoint recording the catalog) may
/// hold, each of which a reader refuses when it is newer than it reads: the catalog's own,
/// the change logs' and the state store's.
const ENCODINGS: [(&str, &str, u32); 3] = [
    ("format", "of format", CATALOG_FORMAT),
    (
        "change_log_format",
        "has change logs of format",
        crate::changelog::FORMAT,
    ),
    ("state_format", "has state of format", crate::state::FORMAT),
];

/// A catalog read as `what`: one written by a newer version (in any of its `ENCODINGS`) is
/// refused before the rest is read; one that does not decode is damaged.
fn decode(read: serde_json::Result<serde_json::Value>, what: &str) -> Result<Persisted> {
    let damaged = |e: serde_json::Error| {
        Error::new(
            ErrorKind::DataCorruption,
            format!("cannot read {what}: {e}"),
        )
    };
    let value = read.map_err(damaged)?;
    for (field, says, reads) in ENCODINGS {
        let written = value.get(field).and_then(|f| f.as_u64()).unwrap_or(0);
        if written > reads as u64 {
            return Err(Error::not_supported(format!(
                "{what} {says} {written}, newer than this version of Weir reads (up to {reads})"
            ))
            .with_hint("Start the version of Weir that wrote it, or a newer one."));
        }
    }
    let data: Persisted = serde_json::from_value(value).map_err(damaged)?;
    // Written back in this version's formats from now on.
    Ok(Persisted {
        format: CATALOG_FORMAT,
        change_log_format: crate::changelog::FORMAT,
        state_format: crate::state::FORMAT,
        ..data
    })
}

impl Catalog {
    /// Loads the catalog from `dir`, or starts an empty one and saves it: from the first
    /// start on, a data directory always holds the catalog its state belongs to.
    pub fn load(dir: &Path) -> Result<Catalog> {
        Catalog::open(dir, None)
    }

    /// [`Catalog::load`], where a catalog without roles (new, or of a version before them)
    /// gets the bootstrap superuser with `password`'s verifier, saved with it.
    pub fn open(dir: &Path, password: Option<Verifier>) -> Result<Catalog> {
        let path = dir.join("catalog.json");
        let what = format!("catalog {}", path.display());
        let (data, new) = match std::fs::read(&path) {
            Ok(bytes) => (decode(serde_json::from_slice(&bytes), &what)?, false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (
                Persisted {
                    format: CATALOG_FORMAT,
                    change_log_format: crate::changelog::FORMAT,
                    state_format: crate::state::FORMAT,
                    next_id: FIRST_USER_ID,
                    schema_grants: super::privileges::default_schema_grants(),
                    ..Persisted::default()
                },
                true,
            ),
            Err(e) => return Err(e.into()),
        };
        let mut catalog = Catalog {
            path,
            data,
            schemas: BTreeMap::new(),
            hidden: BTreeMap::new(),
        };
        if catalog.bootstrap_roles(password) || new {
            catalog.save()?;
        }
        Ok(catalog)
    }

    /// The catalog as a checkpoint records it (`catalog.json`'s form), ids not yet saved
    /// included: a restore must never hand out an id this server has used.
    pub fn saved(&self) -> Result<serde_json::Value> {
        serde_json::to_value(&self.data)
            .map_err(|e| Error::internal(format!("cannot encode catalog: {e}")))
    }

    pub(super) fn save(&self) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(&self.data)
            .map_err(|e| Error::internal(format!("cannot encode catalog: {e}")))?;
        let tmp = self.path.with_extension("json.tmp");
        crate::blocking(|| {
            crate::failpoint::io("catalog.save")?;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            if let Some(dir) = self.path.parent() {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        })
    }

    /// Writes a checkpoint's catalog as the catalog of `dir` (a restore without local data).
    pub fn install(dir: &Path, saved: &serde_json::Value) -> Result<()> {
        let data = decode(Ok(saved.clone()), "a checkpoint's catalog")?;
        let catalog = Catalog {
            path: dir.join("catalog.json"),
            data,
            schemas: BTreeMap::new(),
            hidden: BTreeMap::new(),
        };
        catalog.save()
    }

    /// The objects of a catalog as a checkpoint's manifest holds it (`catalog.json`'s form).
    pub fn objects_in(saved: &serde_json::Value) -> Result<Vec<Object>> {
        Ok(decode(Ok(saved.clone()), "a checkpoint's catalog")?.objects)
    }
}
