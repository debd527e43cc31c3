//! Sinks' connectors: where a sink's changes go. A connector is one implementation of
//! `Connector`, in its own file, named in the registry (`CONNECTORS`); it opens the
//! `stream::sink::SinkWriter` a sink's actor drives through the checkpoints' two-phase commit
//! (`docs/design/0008-connectors.md`, "Sinks"). The rest of Weir sees sinks' connectors
//! through this module alone.

mod blackhole;

use crate::catalog::ViewDef;
use crate::error::{Error, Result};
use crate::stream::SinkWriter;

/// Every sink connector, by the name `WITH (connector = '...')` gives.
const CONNECTORS: &[&dyn Connector] = &[&blackhole::Blackhole];

/// A kind of sink: where its changes go.
pub trait Connector: Send + Sync {
    /// The name `WITH (connector = '...')` gives.
    fn name(&self) -> &'static str;

    /// The writer of `def`'s changes. `recovered` is the handle its writer pre-committed at
    /// the checkpoint the server restored (`None` for a new sink, or one restored from a
    /// checkpoint that kept none): the writer commits what the handle names if it is not yet
    /// committed, and aborts whatever it had begun after it, before it takes new changes.
    fn open(
        &self,
        def: &ViewDef,
        recovered: Option<&serde_json::Value>,
    ) -> Result<Box<dyn SinkWriter>>;
}

/// The connector named `name` (any case).
pub fn connector(name: &str) -> Result<&'static dyn Connector> {
    let name = name.to_lowercase();
    CONNECTORS
        .iter()
        .copied()
        .find(|c| c.name() == name)
        .ok_or_else(|| {
            let names: Vec<String> = CONNECTORS
                .iter()
                .map(|c| format!("'{}'", c.name()))
                .collect();
            Error::not_supported(format!("sink connector \"{name}\" is not supported"))
                .with_hint(format!("Sinks take connector = {}.", names.join(" or ")))
        })
}

/// The writer of sink `def`'s changes, recovered from `handle` (see `Connector::open`).
/// Every sink is a blackhole until the catalog keeps a sink's connector and options.
pub fn open(def: &ViewDef, handle: Option<&serde_json::Value>) -> Result<Box<dyn SinkWriter>> {
    connector("blackhole")?.open(def, handle)
}
