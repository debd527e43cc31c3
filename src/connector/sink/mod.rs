//! Sinks' connectors: where a sink's changes go. A connector is one implementation of
//! `Connector`, in its own file, named in the registry (`CONNECTORS`); it checks a new sink's
//! options against what its view emits and opens the `stream::SinkWriter` that delivers the
//! sink's log, checkpoint by checkpoint (`docs/design/0014-sink-log.md`). The options every
//! delivering connector shares (the FORMAT clause, the key, `snapshot`, the log's bound) are
//! read here, as a `Spec`. The rest of Weir sees sinks' connectors through this module alone.

mod blackhole;
mod files;
mod kafka;
mod postgres;

use std::collections::BTreeMap;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::row::{RowConverter, SortField};

use super::options::{flag, Options};
use crate::catalog::{self, ViewDef};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::{Op, SinkWriter, StreamChunk};

/// Every sink connector, by the name `WITH (connector = '...')` gives.
const CONNECTORS: &[&dyn Connector] = &[
    &blackhole::Blackhole,
    &files::FILES,
    &files::S3,
    &kafka::Kafka,
    &postgres::Postgres,
];

/// The log's bound by default (`sink.log.bytes.max`).
const LOG_BYTES_MAX_DEFAULT: u64 = 1 << 30;

/// What a sink's view emits.
#[derive(Debug, Clone, Copy)]
pub struct Shape<'a> {
    pub schema: &'a SchemaRef,
    /// Columns that identify a row, where the planner can tell (`StreamPlan::key`).
    pub key: Option<&'a [usize]>,
    /// The view only ever inserts.
    pub append_only: bool,
}

/// How a sink sends its changes (`FORMAT ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Each row inserted, as it is; deletes are refused at CREATE (or dropped, with
    /// `force_append_only`).
    Plain,
    /// Each key's row as it is now; a deleted key's row is gone (a tombstone in Kafka).
    Upsert,
    /// Debezium's change events (`before`, `after`, `op`).
    Debezium,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Plain => "plain",
            Format::Upsert => "upsert",
            Format::Debezium => "debezium",
        }
    }
}

/// The options every delivering sink takes, as the catalog keeps them.
#[derive(Debug, Clone)]
pub struct Spec {
    pub format: Format,
    /// `ENCODE ...`, lower-case, where the connector encodes (Kafka, files).
    pub encode: Option<String>,
    /// The key's columns (UPSERT and DEBEZIUM; empty for PLAIN).
    pub key: Vec<usize>,
    /// Deletes are dropped rather than sent (PLAIN over a view that deletes).
    pub force_append_only: bool,
    /// The sink starts with the view's rows (true), or with its changes after CREATE.
    pub snapshot: bool,
    /// Past this many bytes of its log not yet delivered, the sink holds its view's input.
    pub log_bytes_max: u64,
}

impl Spec {
    /// Reads the shared options. `default` is the connector's FORMAT when the statement
    /// gives none (`None`: it must be given), given whether the sink is keyed (a key is known,
    /// and deletes are not to be dropped).
    fn read(
        options: &mut Options,
        shape: &Shape,
        default: impl Fn(bool) -> Option<Format>,
    ) -> Result<Spec> {
        let bad = |m: String| Error::new(ErrorKind::InvalidParameter, m);
        let named_key = match options.take("primary_key") {
            Some(names) => Some(columns(&names, shape.schema)?),
            None => None,
        };
        let key = named_key.or_else(|| shape.key.map(<[usize]>::to_vec));
        let force_append_only =
            flag("force_append_only", options.take("force_append_only"))?.unwrap_or(false);
        let format = match options.take("format").as_deref() {
            Some("plain") => Format::Plain,
            Some("upsert") => Format::Upsert,
            Some("debezium") => Format::Debezium,
            Some(other) => {
                return Err(bad(format!(
                    "FORMAT {} is not one of PLAIN, UPSERT and DEBEZIUM",
                    other.to_uppercase()
                )))
            }
            None => default(key.is_some() && !force_append_only).ok_or_else(|| {
                Error::syntax("this sink needs a FORMAT clause")
                    .with_hint("For example: FORMAT UPSERT ENCODE JSON.")
            })?,
        };
        let encode = options.take("encode");
        let snapshot = flag("snapshot", options.take("snapshot"))?.unwrap_or(true);
        let log_bytes_max = crate::connector::options::count(
            "sink.log.bytes.max",
            options.take("sink.log.bytes.max"),
        )?
        .unwrap_or(LOG_BYTES_MAX_DEFAULT)
        .max(1);
        let key = match format {
            Format::Plain => {
                if !shape.append_only && !force_append_only {
                    return Err(Error::not_supported(
                        "FORMAT PLAIN sends only inserts, and this sink's query can update or \
                         delete rows",
                    )
                    .with_hint(
                        "Use FORMAT UPSERT with a primary_key, or force_append_only = 'true' to \
                         drop deletes.",
                    ));
                }
                Vec::new()
            }
            Format::Upsert | Format::Debezium => key.ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidColumnReference,
                    format!(
                        "FORMAT {} needs a key, and none can be derived from this sink's query",
                        format.name().to_uppercase()
                    ),
                )
                .with_hint("Name the columns that identify a row: primary_key = 'a, b'.")
            })?,
        };
        Ok(Spec {
            format,
            encode,
            key,
            force_append_only,
            snapshot,
            log_bytes_max,
        })
    }

    /// The options `read` takes, written out in full.
    fn kept(&self, schema: &SchemaRef) -> Vec<(String, String)> {
        let mut kept = vec![
            ("format".to_string(), self.format.name().to_string()),
            (
                "force_append_only".into(),
                self.force_append_only.to_string(),
            ),
            ("snapshot".into(), self.snapshot.to_string()),
            ("sink.log.bytes.max".into(), self.log_bytes_max.to_string()),
        ];
        if let Some(e) = &self.encode {
            kept.push(("encode".into(), e.clone()));
        }
        if !self.key.is_empty() {
            let names: Vec<&str> = self
                .key
                .iter()
                .map(|k| schema.field(*k).name().as_str())
                .collect();
            kept.push(("primary_key".into(), names.join(",")));
        }
        kept
    }
}

/// The positions in `schema` of the comma-separated column names `names`.
fn columns(names: &str, schema: &SchemaRef) -> Result<Vec<usize>> {
    let mut key = Vec::new();
    for name in names.split(',').map(str::trim) {
        let at = schema.index_of(name).map_err(|_| {
            Error::new(
                ErrorKind::UndefinedColumn,
                format!("primary_key names column \"{name}\", which the sink's query lacks"),
            )
        })?;
        if key.contains(&at) {
            return Err(Error::new(
                ErrorKind::DuplicateColumn,
                format!("primary_key names column \"{name}\" twice"),
            ));
        }
        key.push(at);
    }
    Ok(key)
}

/// A kind of sink: where its changes go.
pub trait Connector: Send + Sync {
    /// The name `WITH (connector = '...')` gives.
    fn name(&self) -> &'static str;

    /// The FORMAT when the statement gives none, knowing whether the sink has a key; `None`
    /// when the connector needs one given.
    fn default_format(&self, _keyed: bool) -> Option<Format> {
        None
    }

    /// Checks a new sink's own options (less the shared ones, in `spec`), taking those it
    /// knows, and prepares the target where it needs it (a PostgreSQL table). Returns the
    /// options the catalog keeps, written out in full.
    fn create(
        &self,
        name: &str,
        options: &mut Options,
        spec: &Spec,
        schema: &SchemaRef,
    ) -> Result<Vec<(String, String)>>;

    /// The paths on the server's file system the kept options name.
    fn server_paths<'a>(&self, _kept: &'a BTreeMap<String, String>) -> Vec<&'a str> {
        Vec::new()
    }

    /// Whether the sink delivers (through a log); false for one that drops what it gets.
    fn delivers(&self) -> bool {
        true
    }

    /// The writer of sink `name`'s deliveries, from the options `create` kept.
    fn open(
        &self,
        name: &str,
        options: &BTreeMap<String, String>,
        spec: &Spec,
        schema: &SchemaRef,
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

/// Checks a new sink's connector and options (`WITH (...)` less `connector`, the FORMAT
/// clause as `format` and `encode`) against what its view emits; returns what the catalog
/// keeps.
pub fn create(
    name: &str,
    connector_name: Option<&str>,
    pairs: Vec<(String, String)>,
    shape: &Shape,
) -> Result<catalog::Connector> {
    let connector = match connector_name {
        Some(c) => self::connector(c)?,
        None => {
            return Err(
                Error::new(ErrorKind::InvalidParameter, "a sink needs a connector").with_hint(
                    "WITH (connector = 'postgres', ...), or 'blackhole' to drop its changes.",
                ),
            )
        }
    };
    let mut options = Options::new(pairs)?.of_sink();
    let mut kept = Vec::new();
    if connector.delivers() {
        let spec = Spec::read(&mut options, shape, |keyed| connector.default_format(keyed))?;
        kept.extend(connector.create(name, &mut options, &spec, shape.schema)?);
        kept.extend(spec.kept(shape.schema));
    }
    options.finish()?;
    Ok(catalog::Connector::plain(
        connector.name(),
        kept.into_iter().collect(),
    ))
}

/// How a sink's actor and its delivery run, from what the catalog keeps.
pub struct Opened {
    /// `None`: the sink keeps no log and delivers nothing (blackhole).
    pub writer: Option<Box<dyn SinkWriter>>,
    pub spec: Option<Spec>,
}

/// Opens sink `def`, whose rows have `schema`. A sink created before sinks kept their
/// connector is a blackhole.
pub fn open(def: &ViewDef, schema: &SchemaRef) -> Result<Opened> {
    let Some(c) = &def.sink_to else {
        return Ok(Opened {
            writer: None,
            spec: None,
        });
    };
    let connector = self::connector(&c.name)?;
    if !connector.delivers() {
        return Ok(Opened {
            writer: None,
            spec: None,
        });
    }
    // What CREATE checked against the view is kept: the key by name, and the format.
    let shape = Shape {
        schema,
        key: None,
        append_only: true,
    };
    let spec = Spec::read(&mut Options::kept(&c.options).of_sink(), &shape, |_| None)?;
    // A sink whose secrets the server cannot open still runs: its log keeps its changes, and
    // each delivery fails with the reason until a start with the key.
    let writer = match c.check_secrets() {
        Ok(()) => connector.open(&def.name, &c.options, &spec, schema)?,
        Err(e) => Box::new(Unusable(e)),
    };
    Ok(Opened {
        writer: Some(writer),
        spec: Some(spec),
    })
}

/// A key's change in a chunk, net: the row it holds after the chunk, or its row gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Net {
    /// The key holds the chunk's row at this index.
    Holds(usize),
    /// The key's row is gone; the row at this index carries the key.
    Gone(usize),
}

/// The net change per key of `chunk` (`key` its key's columns), in the order the keys first
/// appear; keys whose changes cancel out are left out. A delete takes away the row inserted
/// earlier in the chunk that it equals, or else the row the key held before the chunk.
pub(crate) fn net_changes(chunk: &StreamChunk, key: &[usize]) -> Result<Vec<Net>> {
    let fields = |cols: &mut dyn Iterator<Item = usize>| -> Vec<SortField> {
        cols.map(|c| SortField::new(chunk.data.schema().field(c).data_type().clone()))
            .collect()
    };
    let keys = RowConverter::new(fields(&mut key.iter().copied()))?;
    let keys = keys.convert_columns(
        &key.iter()
            .map(|k| chunk.data.column(*k).clone())
            .collect::<Vec<_>>(),
    )?;
    let rows = RowConverter::new(fields(&mut (0..chunk.data.num_columns())))?;
    let rows = rows.convert_columns(chunk.data.columns())?;
    // Per key: the rows inserted in the chunk and still there, whether a row from before was
    // deleted, and the last row that carried the key.
    struct Changes {
        live: Vec<usize>,
        deleted_before: bool,
        last: usize,
    }
    let mut order: Vec<Vec<u8>> = Vec::new();
    let mut by_key: std::collections::HashMap<Vec<u8>, Changes> = Default::default();
    for (i, op) in chunk.ops.iter().enumerate() {
        let k = keys.row(i).as_ref().to_vec();
        let changes = by_key.entry(k.clone()).or_insert_with(|| {
            order.push(k);
            Changes {
                live: Vec::new(),
                deleted_before: false,
                last: i,
            }
        });
        changes.last = i;
        match op {
            Op::Insert => changes.live.push(i),
            Op::Delete => match changes
                .live
                .iter()
                .position(|&j| rows.row(j) == rows.row(i))
            {
                Some(at) => {
                    changes.live.remove(at);
                }
                None => changes.deleted_before = true,
            },
        }
    }
    Ok(order
        .into_iter()
        .filter_map(|k| {
            let c = by_key.remove(&k)?;
            match c.live.last() {
                Some(&row) => Some(Net::Holds(row)),
                None if c.deleted_before => Some(Net::Gone(c.last)),
                None => None,
            }
        })
        .collect())
}

/// The writer of a sink that cannot reach its target: every call fails with why.
struct Unusable(Error);

#[async_trait::async_trait]
impl SinkWriter for Unusable {
    async fn delivered(&mut self) -> Result<Option<u64>> {
        Err(self.0.clone())
    }

    async fn begin(&mut self, _epoch: u64, _replace: bool) -> Result<()> {
        Err(self.0.clone())
    }

    async fn write(&mut self, _chunk: StreamChunk) -> Result<()> {
        Err(self.0.clone())
    }

    async fn commit(&mut self, _epoch: u64) -> Result<()> {
        Err(self.0.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::test_util::{chunk, schema};
    use datafusion::arrow::datatypes::DataType;

    #[test]
    fn a_chunks_net_change_per_key_is_what_its_key_holds_after_it() {
        let s = schema(&[("k", DataType::Utf8), ("v", DataType::Int64)]);
        // a: updated (insert first, then the old row deleted); b: deleted; c: inserted and
        // deleted again (no change); d: updated twice; e: deleted then inserted.
        let c = chunk(
            &s,
            "+ a 2\n- a 1\n- b 5\n+ c 1\n- c 1\n- d 1\n+ d 2\n- d 2\n+ d 3\n- e 1\n+ e 1",
        );
        let net = net_changes(&c, &[0]).unwrap();
        assert_eq!(
            net,
            [Net::Holds(0), Net::Gone(2), Net::Holds(8), Net::Holds(10)]
        );
    }
}
