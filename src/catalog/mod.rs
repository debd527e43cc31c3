//! The catalog: tables, sources, materialized views, sinks and roles, their columns and
//! dependencies, persisted as one JSON file in the data directory (written atomically on DDL).

mod file;
mod privileges;
mod roles;
mod secrets;

pub use privileges::{
    acl_text, change_acl, denied, is_member_of, Access, AclItem, Grants, Membership, Privilege,
    PUBLIC,
};
pub use roles::{same_bytes, RoleDef, Verifier, BOOTSTRAP_OID, BOOTSTRAP_ROLE, SCRAM_ITERATIONS};
pub use secrets::{undefined_secret, SecretDef, SecretKeys};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};
use crate::types::SqlType;

/// Catalog ids name tables, views and state tables; a table's or view's id is also its
/// actor's id and the id of the state table holding its rows.
pub type ObjectId = u32;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ColumnDef {
    pub name: String,
    pub ty: SqlType,
    pub not_null: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TableDef {
    pub id: ObjectId,
    pub name: String,
    pub columns: Vec<ColumnDef>,
    /// Column positions of the primary key, empty when the table has none.
    pub primary_key: Vec<usize>,
    /// `WATERMARK FOR column AS column - delay`: the event-time column whose watermark the
    /// table sends downstream.
    #[serde(default)]
    pub watermark: Option<WatermarkDef>,
    /// Whether the table's rows are stored with the primary key's columns first, so that a
    /// key is found by a prefix seek (every table created since; older ones store their
    /// columns in their own order, and find a key that does not lead by a scan).
    #[serde(default)]
    pub key_first: bool,
    /// A table fed by a connector instead of DML (`CREATE TABLE ... WITH (connector = ...)`,
    /// `docs/design/0012-connector-tables.md`): read-only to INSERT, UPDATE and DELETE, its
    /// rows what the connector's changes made them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connector: Option<Connector>,
    /// The source whose stream of several tables feeds this one (`CREATE TABLE ... FROM
    /// source TABLE '...'`, PostgreSQL CDC): the table depends on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reads: Option<ObjectId>,
    /// The statement that created the table, as written (`SHOW CREATE TABLE`); tables created
    /// before Weir kept it have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_sql: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatermarkDef {
    pub column: usize,
    /// How far the watermark trails the greatest time seen, in microseconds.
    pub delay_us: i64,
}

/// The Arrow schema of declared columns. Every field is nullable: NOT NULL is enforced where
/// rows come in (a table's write path reports it as PostgreSQL does, SQLSTATE 23502).
pub fn columns_schema(columns: &[ColumnDef]) -> SchemaRef {
    Arc::new(Schema::new(
        columns
            .iter()
            .map(|c| Field::new(&c.name, c.ty.to_arrow(), true))
            .collect::<Vec<_>>(),
    ))
}

impl TableDef {
    /// The table's Arrow schema (`columns_schema`).
    pub fn schema(&self) -> SchemaRef {
        columns_schema(&self.columns)
    }

    /// The order in which the table's rows store their columns (`RowCodec::ordered`): the
    /// primary key's first, then the others; empty for the columns' own order.
    pub fn storage_order(&self) -> Vec<usize> {
        if !self.key_first || self.primary_key.is_empty() {
            return Vec::new();
        }
        let rest = (0..self.columns.len()).filter(|c| !self.primary_key.contains(c));
        self.primary_key.iter().copied().chain(rest).collect()
    }

    /// What the table's connector reads, as a connector sees a source: the table's id, name,
    /// columns, watermark and primary key; `None` for a table fed by DML.
    pub fn feed(&self) -> Option<SourceDef> {
        Some(SourceDef {
            id: self.id,
            name: self.name.clone(),
            columns: self.columns.clone(),
            watermark: self.watermark,
            connector: self.connector.clone()?,
            primary_key: self.primary_key.clone(),
            create_sql: None,
        })
    }

    /// The statement that creates the table: as written, or, for a table fed by DML created
    /// before Weir kept it, written from the definition.
    pub fn create_statement(&self) -> Option<String> {
        if let Some(sql) = &self.create_sql {
            return Some(sql.clone());
        }
        if self.connector.is_some() || self.reads.is_some() {
            return None;
        }
        let mut parts: Vec<String> = (self.columns.iter())
            .map(|c| {
                let not_null = if c.not_null { " NOT NULL" } else { "" };
                format!("{} {}{not_null}", c.name, c.ty)
            })
            .collect();
        if !self.primary_key.is_empty() {
            let key: Vec<&str> = (self.primary_key.iter())
                .map(|&i| self.columns[i].name.as_str())
                .collect();
            parts.push(format!("PRIMARY KEY ({})", key.join(", ")));
        }
        if let Some(w) = &self.watermark {
            let column = &self.columns[w.column].name;
            parts.push(format!(
                "WATERMARK FOR {column} AS {column} - INTERVAL '{} microseconds'",
                w.delay_us
            ));
        }
        Some(format!("CREATE TABLE {} ({})", self.name, parts.join(", ")))
    }

    /// Whether a key is a prefix of the stored rows that hold it.
    pub fn key_leads(&self) -> bool {
        !self.primary_key.is_empty()
            && (self.key_first || self.primary_key.iter().enumerate().all(|(i, c)| i == *c))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ViewDef {
    pub id: ObjectId,
    pub name: String,
    /// The defining query, as the user wrote it.
    pub query: String,
    /// The relations the query reads.
    pub depends_on: Vec<ObjectId>,
    /// The state tables of the view's operators (the view's own rows are under `id`).
    pub state_tables: Vec<ObjectId>,
    /// EMIT ON WINDOW CLOSE: each window's rows appear once, when the watermark passes it.
    #[serde(default)]
    pub emit_on_window_close: bool,
    /// The actors that compute the view besides its own, fragment by fragment
    /// (`StreamPlan::fragments`). Each actor takes its operators' tables from `state_tables`
    /// in the same order: the view's own actor first, then each fragment's actors in turn.
    #[serde(default)]
    pub workers: Vec<ObjectId>,
    /// The number of actors of each parallel fragment: how the view's plan was cut, and how
    /// its keys' 256 virtual nodes are spread (contiguous ranges, `VnodeMapping`). 1: the
    /// view runs as one actor.
    #[serde(default)]
    pub parallelism: usize,
    /// A sink (`CREATE SINK`) rather than a view: its changes are counted and dropped (the
    /// `blackhole` connector), not kept, so it is not a relation others read.
    #[serde(default)]
    pub sink: bool,
    /// A sink's connector and the options it keeps (`sink::connector`); `None` for a sink
    /// created before sinks kept theirs, which is a blackhole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink_to: Option<Connector>,
    /// Columns that identify a row of the view (`StreamPlan::key`), where the planner could
    /// tell when it was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<Vec<usize>>,
    /// Its query's integer constants are typed as PostgreSQL types them (`integer` when they
    /// fit); views created before were planned with every one `bigint`, and are planned so
    /// again, since their state holds what that typing gave (`IntegerLiterals` in `sql/rules.rs`).
    #[serde(default)]
    pub int4_literals: bool,
    /// The compiled plan the view runs (`stream::stored`), kept so that a restart runs the
    /// plan its state was written by, not the one the running planner would give its query.
    /// Absent from catalogs of format 2 and before, whose views are planned once more at their
    /// first start and keep that plan from then on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<serde_json::Value>,
}

impl ViewDef {
    pub fn parallelism(&self) -> usize {
        match self.parallelism {
            // Recorded before the field existed: one fragment of workers, or none.
            0 => self.workers.len().max(1),
            p => p,
        }
    }

    pub fn create_sql(&self) -> String {
        if self.sink {
            let quoted = |v: &str| format!("'{}'", v.replace('\'', "''"));
            let mut with = vec![format!("connector = 'blackhole'")];
            let (mut format, mut encode) = (None, None);
            if let Some(c) = &self.sink_to {
                with[0] = format!("connector = {}", quoted(&c.name));
                for (k, v) in &c.options {
                    match (k.as_str(), c.secrets.get(k)) {
                        ("format", _) => format = Some(v.to_uppercase()),
                        ("encode", _) => encode = Some(v.to_uppercase()),
                        // A secret's option names it, never its value.
                        (_, Some(secret)) => {
                            with.push(format!("{k} = SECRET \"{}\"", secret.replace('"', "\"\"")))
                        }
                        _ => with.push(format!("{k} = {}", quoted(v))),
                    }
                }
            }
            let mut sql = format!(
                "CREATE SINK {} AS {} WITH ({})",
                self.name,
                self.query,
                with.join(", ")
            );
            if let (Some(f), Some(e)) = (format, encode) {
                sql.push_str(&format!(" FORMAT {f} ENCODE {e}"));
            }
            return sql;
        }
        let emit = if self.emit_on_window_close {
            " EMIT ON WINDOW CLOSE"
        } else {
            ""
        };
        format!(
            "CREATE MATERIALIZED VIEW {} AS {}{emit}",
            self.name, self.query
        )
    }
}

/// A source (`CREATE SOURCE`): an append-only stream produced by a connector, replayable from
/// an offset (rows produced so far). Its rows are not kept: views read them as they come.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SourceDef {
    pub id: ObjectId,
    pub name: String,
    pub columns: Vec<ColumnDef>,
    pub watermark: Option<WatermarkDef>,
    pub connector: Connector,
    /// The primary key of a connector table (`TableDef::feed`), whose connector gives changes
    /// by key; a source has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub primary_key: Vec<usize>,
    /// The statement that created the source, as written (`SHOW CREATE SOURCE`); sources
    /// created before Weir kept it have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_sql: Option<String>,
}

/// A source's connector and the options it keeps, as the connector validated them at
/// `CREATE SOURCE` (`source::connector`): the catalog does not know what they mean.
#[derive(Clone, PartialEq)]
pub struct Connector {
    pub name: String,
    /// In memory, every option with its value, secrets' values included once opened; saved,
    /// those of `secrets` are left out.
    pub options: BTreeMap<String, String>,
    /// The options whose values are secrets (`password = SECRET name`), with the secrets'
    /// names: what the catalog saves in their place.
    pub secrets: BTreeMap<String, String>,
}

impl Serialize for Connector {
    /// `{name, options, secrets}`, the options without the secrets' values.
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Saved<'a> {
            name: &'a str,
            options: BTreeMap<&'a str, &'a str>,
            #[serde(skip_serializing_if = "BTreeMap::is_empty")]
            secrets: &'a BTreeMap<String, String>,
        }
        Saved {
            name: &self.name,
            options: (self.options.iter())
                .filter(|(k, _)| !self.secrets.contains_key(*k))
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect(),
            secrets: &self.secrets,
        }
        .serialize(s)
    }
}

impl std::fmt::Debug for Connector {
    /// The options with the secrets' values left out, as the catalog saves them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let options: BTreeMap<&str, &str> = (self.options.iter())
            .map(|(k, v)| match self.secrets.contains_key(k) {
                true => (k.as_str(), "********"),
                false => (k.as_str(), v.as_str()),
            })
            .collect();
        (f.debug_struct("Connector"))
            .field("name", &self.name)
            .field("options", &options)
            .field("secrets", &self.secrets)
            .finish()
    }
}

impl Connector {
    /// A connector none of whose options are secrets.
    pub fn plain(name: impl Into<String>, options: BTreeMap<String, String>) -> Connector {
        Connector {
            name: name.into(),
            options,
            secrets: BTreeMap::new(),
        }
    }
}

impl<'de> Deserialize<'de> for Connector {
    /// Reads this format's `{name, options}`, and the typed form catalogs held up to format 1
    /// (`{"Nexmark": {...}}`, `{"File": {...}}`) as the same options.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        enum Typed {
            Nexmark {
                stream: String,
                events: Option<u64>,
                events_per_second: Option<u64>,
            },
            File {
                path: String,
                header: bool,
            },
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Stored {
            Named {
                name: String,
                options: BTreeMap<String, String>,
                #[serde(default)]
                secrets: BTreeMap<String, String>,
            },
            Typed(Typed),
        }
        let (name, options): (&str, Vec<(&str, Option<String>)>) = match Stored::deserialize(d)? {
            Stored::Named {
                name,
                options,
                secrets,
            } => {
                return Ok(Connector {
                    name,
                    options,
                    secrets,
                })
            }
            Stored::Typed(Typed::Nexmark {
                stream,
                events,
                events_per_second,
            }) => (
                "nexmark",
                vec![
                    ("stream", Some(stream)),
                    ("events", events.map(|e| e.to_string())),
                    (
                        "events_per_second",
                        events_per_second.map(|e| e.to_string()),
                    ),
                ],
            ),
            Stored::Typed(Typed::File { path, header }) => (
                "file",
                vec![("path", Some(path)), ("header", Some(header.to_string()))],
            ),
        };
        Ok(Connector::plain(
            name,
            (options.into_iter())
                .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
                .collect(),
        ))
    }
}

impl SourceDef {
    pub fn schema(&self) -> SchemaRef {
        columns_schema(&self.columns)
    }
}

/// The format `catalog.json` is written in. A reader refuses a newer one rather than misread
/// it (an older Weir would ignore what it does not know). Catalogs written before formats
/// were recorded are format 0, the same encoding without the field.
/// 2: a source's connector is its name and options (`Connector`), no longer a typed enum.
/// 3: a view keeps its compiled plan (`ViewDef::plan`).
/// 4: a table may be fed by a connector (`TableDef::connector`).
/// 5: roles, with their passwords' verifiers (`roles`): a version before would drop them.
/// 6: owners, grants and role memberships (`access`, `schema_grants`, `members`): a version
/// before would drop them and let every role read and change everything.
/// 7: secrets (`secrets`), and connectors' options that name them (`Connector::secrets`): a
/// version before would drop them and connect without the secrets' values.
pub const CATALOG_FORMAT: u32 = 7;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Persisted {
    #[serde(default)]
    format: u32,
    /// `changelog::FORMAT` and `state::FORMAT` of the newest encodings the data directory
    /// may hold (1 where a catalog does not say: the encodings before they had numbers).
    #[serde(default = "first_format")]
    change_log_format: u32,
    #[serde(default = "first_format")]
    state_format: u32,
    next_id: ObjectId,
    /// Tables and views in creation order, so that a restart recreates them in an order where
    /// each view's inputs exist before it.
    objects: Vec<Object>,
    /// The objects created by a transaction block not yet committed, with the block's number:
    /// only that block sees them, and a start drops those whose block left no commit file.
    /// (A version of Weir from before blocks ran DDL would ignore the field and keep them:
    /// start this one once after a crash to settle them first.)
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    uncommitted: BTreeMap<ObjectId, u64>,
    /// The roles in creation order, the bootstrap superuser first (`Catalog::bootstrap_roles`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    roles: Vec<RoleDef>,
    /// Each relation's owner and grants, by id; a relation without an entry (created before
    /// Weir kept them) belongs to the bootstrap superuser and has no grants.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    access: BTreeMap<ObjectId, Access>,
    /// What the public schema grants (`GRANT CREATE ON SCHEMA public`).
    #[serde(default = "privileges::default_schema_grants")]
    schema_grants: Vec<AclItem>,
    /// `GRANT role TO role`, in the order granted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    members: Vec<Membership>,
    /// `CREATE SECRET`s, each value sealed under the server's secret key (`secrets`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    secrets: Vec<SecretDef>,
}

/// The transaction block a lookup is made for, whose own uncommitted objects it sees and whose
/// own drops it does not: `None` outside a block (and for the server's own lookups, which see
/// every object).
pub type Scope = Option<u64>;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Object {
    Table(TableDef),
    View(ViewDef),
    Source(SourceDef),
}

/// What an object is, as DDL names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Table,
    MaterializedView,
    Source,
    Sink,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Table => "table",
            Kind::MaterializedView => "materialized view",
            Kind::Source => "source",
            Kind::Sink => "sink",
        }
    }
}

impl Object {
    pub fn id(&self) -> ObjectId {
        match self {
            Object::Table(t) => t.id,
            Object::View(v) => v.id,
            Object::Source(s) => s.id,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Object::Table(t) => &t.name,
            Object::View(v) => &v.name,
            Object::Source(s) => &s.name,
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Object::Table(_) => Kind::Table,
            Object::View(v) if v.sink => Kind::Sink,
            Object::View(_) => Kind::MaterializedView,
            Object::Source(_) => Kind::Source,
        }
    }

    pub fn kind_name(&self) -> &'static str {
        self.kind().name()
    }
}

fn first_format() -> u32 {
    1
}

/// The catalog in memory. Callers serialise DDL; each change is saved before it returns.
pub struct Catalog {
    path: PathBuf,
    data: Persisted,
    /// The schema of every relation, by id (views' schemas come from planning their query).
    schemas: BTreeMap<ObjectId, SchemaRef>,
    /// The objects an open transaction block has dropped, with the block's number: hidden
    /// from that block, kept for every other session until the block commits. Never saved: a
    /// drop not committed did not happen.
    hidden: BTreeMap<ObjectId, u64>,
}

/// First id handed out: small ids stay free for system relations.
const FIRST_USER_ID: ObjectId = 1000;

impl Catalog {
    /// Objects in creation order.
    pub fn objects(&self) -> &[Object] {
        &self.data.objects
    }

    pub fn allocate_ids(&mut self, n: usize) -> Vec<ObjectId> {
        let start = self.data.next_id;
        self.data.next_id += n as ObjectId;
        (start..self.data.next_id).collect()
    }

    /// Whether `scope` sees object `id`: a committed object unless its own block dropped it,
    /// an uncommitted one only from its block.
    pub fn visible(&self, id: ObjectId, scope: Scope) -> bool {
        if let Some(block) = self.data.uncommitted.get(&id) {
            return scope == Some(*block);
        }
        self.hidden
            .get(&id)
            .is_none_or(|block| scope != Some(*block))
    }

    /// Whether `scope`'s block has dropped object `id` (it goes when the block commits).
    pub fn dropped_by(&self, id: ObjectId, scope: Scope) -> bool {
        scope.is_some() && self.hidden.get(&id).copied() == scope
    }

    /// The objects `scope` sees, in creation order.
    pub fn visible_objects(&self, scope: Scope) -> impl Iterator<Item = &Object> {
        self.data
            .objects
            .iter()
            .filter(move |o| self.visible(o.id(), scope))
    }

    /// The object named `name` that `scope` sees.
    pub fn get(&self, name: &str, scope: Scope) -> Option<&Object> {
        self.visible_objects(scope).find(|o| o.name() == name)
    }

    pub fn by_id(&self, id: ObjectId) -> Option<&Object> {
        self.data.objects.iter().find(|o| o.id() == id)
    }

    pub fn table(&self, name: &str, scope: Scope) -> Result<&TableDef> {
        match self.get(name, scope) {
            Some(Object::Table(t)) => Ok(t),
            Some(Object::View(_) | Object::Source(_)) => Err(Error::new(
                ErrorKind::WrongObjectType,
                format!("\"{name}\" is not a table"),
            )
            .with_hint("Only tables can be changed directly.")),
            None => Err(undefined_table(name)),
        }
    }

    pub fn schema(&self, id: ObjectId) -> Option<SchemaRef> {
        self.schemas.get(&id).cloned()
    }

    pub fn set_schema(&mut self, id: ObjectId, schema: SchemaRef) {
        self.schemas.insert(id, schema);
    }

    /// Forgets the schema of an object that was not added after all.
    pub fn forget_schema(&mut self, id: ObjectId) {
        self.schemas.remove(&id);
    }

    /// Refuses a name already taken by a relation: by any, also one another block created
    /// and has not committed (PostgreSQL would wait for that block's end), except one that
    /// `scope` has dropped.
    pub fn check_free(&self, name: &str, scope: Scope) -> Result<()> {
        let taken = self.data.objects.iter().find(|o| {
            o.name() == name
                && (self.data.uncommitted.contains_key(&o.id()) || self.visible(o.id(), scope))
        });
        if let Some(o) = taken {
            return Err(Error::new(
                ErrorKind::DuplicateObject,
                format!("relation \"{}\" already exists", o.name()),
            ));
        }
        Ok(())
    }

    /// Adds an object owned by role `owner`; with `scope` a block, as that block's until it
    /// commits.
    pub fn add(&mut self, object: Object, scope: Scope, owner: u32) -> Result<()> {
        let id = object.id();
        self.data.objects.push(object);
        if let Some(block) = scope {
            self.data.uncommitted.insert(id, block);
        }
        let grants = None;
        self.data.access.insert(id, Access { owner, grants });
        if let Err(e) = self.save() {
            self.data.objects.pop();
            self.data.uncommitted.remove(&id);
            self.data.access.remove(&id);
            return Err(e);
        }
        Ok(())
    }

    /// Forgets the owners and grants of relations no longer in the catalog.
    fn prune_access(&mut self) {
        let objects = &self.data.objects;
        (self.data.access).retain(|id, _| objects.iter().any(|o| o.id() == *id));
    }

    /// Hides objects from block `block`, which dropped them; the others see them until the
    /// block commits.
    pub fn hide(&mut self, ids: &[ObjectId], block: u64) {
        for id in ids {
            self.hidden.insert(*id, block);
        }
    }

    /// What block `block` changed and has not committed: the objects it created, and those
    /// it dropped, each in creation order.
    pub fn block_changes(&self, block: u64) -> (Vec<ObjectId>, Vec<ObjectId>) {
        let of = |marks: &BTreeMap<ObjectId, u64>| -> Vec<ObjectId> {
            self.data
                .objects
                .iter()
                .map(Object::id)
                .filter(|id| marks.get(id) == Some(&block))
                .collect()
        };
        (of(&self.data.uncommitted), of(&self.hidden))
    }

    /// Forgets the drops of block `block` (rolled back): its objects are its to see again.
    pub fn unhide(&mut self, block: u64) {
        self.hidden.retain(|_, b| *b != block);
    }

    /// Applies what block `block` changed, as its commit: the objects it created become
    /// everyone's and those it dropped (`dropped`) go. Saved, or (when the save fails) not
    /// changed.
    pub fn commit_block(&mut self, block: u64, dropped: &[ObjectId]) -> Result<()> {
        let before = (self.data.clone(), self.hidden.clone());
        self.data.uncommitted.retain(|_, b| *b != block);
        self.hidden.retain(|_, b| *b != block);
        self.data.objects.retain(|o| !dropped.contains(&o.id()));
        self.prune_access();
        if let Err(e) = self.save() {
            (self.data, self.hidden) = before;
            return Err(e);
        }
        for id in dropped {
            self.schemas.remove(id);
        }
        Ok(())
    }

    /// At start: applies the changes of the blocks that committed (`committed`: each one's
    /// number with the objects it dropped, from the commit files) and removes the objects of
    /// the others, which never did. Returns the objects removed, whose state and logs can go.
    pub fn settle_blocks(
        &mut self,
        committed: &BTreeMap<u64, Vec<ObjectId>>,
    ) -> Result<Vec<Object>> {
        if self.data.uncommitted.is_empty() && committed.is_empty() {
            return Ok(Vec::new());
        }
        let dropped: Vec<ObjectId> = committed.values().flatten().copied().collect();
        let uncommitted = std::mem::take(&mut self.data.uncommitted);
        let (gone, kept): (Vec<Object>, Vec<Object>) = std::mem::take(&mut self.data.objects)
            .into_iter()
            .partition(|o| {
                dropped.contains(&o.id())
                    || uncommitted
                        .get(&o.id())
                        .is_some_and(|b| !committed.contains_key(b))
            });
        self.data.objects = kept;
        self.prune_access();
        self.save()?;
        Ok(gone)
    }

    /// Keeps `plan` as view `id`'s compiled plan.
    pub fn set_view_plan(&mut self, id: ObjectId, plan: serde_json::Value) -> Result<()> {
        let Some(Object::View(v)) = self.data.objects.iter_mut().find(|o| o.id() == id) else {
            return Err(Error::internal("a plan kept for a view not in the catalog"));
        };
        let before = v.plan.replace(plan);
        if let Err(e) = self.save() {
            if let Some(Object::View(v)) = self.data.objects.iter_mut().find(|o| o.id() == id) {
                v.plan = before;
            }
            return Err(e);
        }
        Ok(())
    }

    /// Removes objects by id.
    pub fn remove(&mut self, ids: &[ObjectId]) -> Result<()> {
        let before = self.data.clone();
        self.data.objects.retain(|o| !ids.contains(&o.id()));
        self.data.uncommitted.retain(|id, _| !ids.contains(id));
        self.prune_access();
        if let Err(e) = self.save() {
            self.data = before;
            return Err(e);
        }
        for id in ids {
            self.schemas.remove(id);
            self.hidden.remove(id);
        }
        Ok(())
    }

    /// The views that read `id`, directly or through other views (and the tables a source's
    /// stream feeds), dependents after the objects they depend on.
    pub fn dependents(&self, id: ObjectId) -> Vec<ObjectId> {
        let mut found: Vec<ObjectId> = Vec::new();
        let mut frontier = vec![id];
        while let Some(current) = frontier.pop() {
            for o in &self.data.objects {
                let reads = match o {
                    Object::View(v) => v.depends_on.contains(&current),
                    Object::Table(t) => t.reads == Some(current),
                    Object::Source(_) => false,
                };
                if reads && !found.contains(&o.id()) {
                    found.push(o.id());
                    frontier.push(o.id());
                }
            }
        }
        // Creation order puts every view after what it reads.
        let order = |id: &ObjectId| self.data.objects.iter().position(|o| o.id() == *id);
        found.sort_by_key(order);
        found
    }
}

pub fn undefined_table(name: &str) -> Error {
    Error::new(
        ErrorKind::UndefinedTable,
        format!("relation \"{name}\" does not exist"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connectors_read_in_this_format_and_in_the_typed_one_of_format_1() {
        let read = |json: &str| serde_json::from_str::<Connector>(json).unwrap();
        let options = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let nexmark =
            read(r#"{"Nexmark": {"stream": "bid", "events": 5000, "events_per_second": null}}"#);
        assert_eq!(nexmark.name, "nexmark");
        assert_eq!(
            nexmark.options,
            options(&[("stream", "bid"), ("events", "5000")])
        );
        let file = read(r#"{"File": {"path": "/in", "header": true}}"#);
        assert_eq!(file.name, "file");
        assert_eq!(
            file.options,
            options(&[("path", "/in"), ("header", "true")])
        );
        let written = serde_json::to_string(&file).unwrap();
        assert_eq!(read(&written), file);
        assert!(serde_json::from_str::<Connector>(r#"{"Kafka": {}}"#).is_err());
    }

    fn view(id: ObjectId, name: &str, deps: &[ObjectId]) -> Object {
        Object::View(ViewDef {
            id,
            name: name.into(),
            query: "SELECT 1".into(),
            depends_on: deps.to_vec(),
            state_tables: vec![],
            emit_on_window_close: false,
            workers: vec![],
            parallelism: 1,
            sink: false,
            sink_to: None,
            key: None,
            int4_literals: true,
            plan: None,
        })
    }

    fn table(id: ObjectId, name: &str) -> Object {
        Object::Table(TableDef {
            id,
            name: name.into(),
            columns: vec![],
            primary_key: vec![],
            watermark: None,
            key_first: true,
            connector: None,
            reads: None,
            create_sql: None,
        })
    }

    #[test]
    fn a_blocks_objects_are_its_own_until_it_commits_and_gone_at_start_unless_it_did() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Catalog::load(dir.path()).unwrap();
        let ids = c.allocate_ids(4);
        c.add(table(ids[0], "t"), None, BOOTSTRAP_OID).unwrap();
        // Block 1 creates a table and drops t; block 2 creates one too.
        c.add(table(ids[1], "mine"), Some(1), BOOTSTRAP_OID)
            .unwrap();
        c.hide(&[ids[0]], 1);
        c.add(table(ids[2], "theirs"), Some(2), BOOTSTRAP_OID)
            .unwrap();
        let names = |c: &Catalog, scope: Scope| -> Vec<String> {
            c.visible_objects(scope)
                .map(|o| o.name().to_string())
                .collect()
        };
        assert_eq!(names(&c, None), ["t"]);
        assert_eq!(names(&c, Some(1)), ["mine"]);
        assert_eq!(names(&c, Some(2)), ["t", "theirs"]);
        // A name another block holds is taken; one the block itself dropped is free for it.
        assert!(c.check_free("theirs", Some(1)).is_err());
        assert!(c.check_free("t", Some(1)).is_ok());
        assert!(c.check_free("t", Some(2)).is_err());
        assert_eq!(c.block_changes(1), (vec![ids[1]], vec![ids[0]]));
        // Block 1 commits; block 2 never does (the server stops).
        c.commit_block(1, &[ids[0]]).unwrap();
        assert_eq!(names(&c, None), ["mine"]);
        let mut c = Catalog::load(dir.path()).unwrap();
        assert_eq!(names(&c, Some(2)), ["mine", "theirs"]);
        let gone = c.settle_blocks(&BTreeMap::new()).unwrap();
        assert_eq!(gone.iter().map(Object::id).collect::<Vec<_>>(), [ids[2]]);
        // A block whose commit file remains is applied at start.
        c.add(table(ids[3], "late"), Some(7), BOOTSTRAP_OID)
            .unwrap();
        let mut c = Catalog::load(dir.path()).unwrap();
        let gone = c
            .settle_blocks(&BTreeMap::from([(7, vec![ids[1]])]))
            .unwrap();
        assert_eq!(gone.iter().map(Object::id).collect::<Vec<_>>(), [ids[1]]);
        let c = Catalog::load(dir.path()).unwrap();
        assert_eq!(names(&c, None), ["late"]);
    }

    #[test]
    fn survives_reload_and_finds_dependents_transitively() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Catalog::load(dir.path()).unwrap();
        let ids = c.allocate_ids(4);
        c.add(table(ids[0], "t"), None, BOOTSTRAP_OID).unwrap();
        c.add(view(ids[1], "v1", &[ids[0]]), None, BOOTSTRAP_OID)
            .unwrap();
        c.add(view(ids[2], "v2", &[ids[1]]), None, BOOTSTRAP_OID)
            .unwrap();
        c.add(view(ids[3], "v3", &[ids[0]]), None, BOOTSTRAP_OID)
            .unwrap();
        let mut c = Catalog::load(dir.path()).unwrap();
        assert_eq!(c.dependents(ids[0]), vec![ids[1], ids[2], ids[3]]);
        assert_eq!(c.dependents(ids[2]), Vec::<ObjectId>::new());
        assert_eq!(
            c.check_free("v2", None).unwrap_err().kind,
            ErrorKind::DuplicateObject
        );
        assert_eq!(c.allocate_ids(1).len(), 1);
    }

    #[test]
    fn a_catalog_records_its_format_and_a_newer_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.json");
        // Written before formats were recorded: read, and written back with one.
        std::fs::write(&path, r#"{"next_id": 1000, "objects": []}"#).unwrap();
        let mut c = Catalog::load(dir.path()).unwrap();
        let ids = c.allocate_ids(1);
        c.add(view(ids[0], "v", &[]), None, BOOTSTRAP_OID).unwrap();
        let saved: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(saved["format"], CATALOG_FORMAT);
        assert_eq!(c.saved().unwrap()["format"], CATALOG_FORMAT);
        // A newer format, from the data directory or a checkpoint: refused, not misread.
        let newer = format!(
            r#"{{"format": {}, "next_id": 1000, "objects": []}}"#,
            CATALOG_FORMAT + 1
        );
        std::fs::write(&path, &newer).unwrap();
        let e = Catalog::load(dir.path()).err().unwrap();
        assert_eq!(e.kind, ErrorKind::NotSupported, "{e}");
        assert!(e.message.contains("newer than this version"), "{e}");
        let value: serde_json::Value = serde_json::from_str(&newer).unwrap();
        assert_eq!(
            Catalog::objects_in(&value).err().unwrap().kind,
            ErrorKind::NotSupported
        );
        // Refused before the rest is read, however different its shape.
        let reshaped = format!(r#"{{"format": {}, "objects": 7}}"#, CATALOG_FORMAT + 1);
        let value: serde_json::Value = serde_json::from_str(&reshaped).unwrap();
        assert_eq!(
            Catalog::objects_in(&value).err().unwrap().kind,
            ErrorKind::NotSupported
        );
    }

    #[test]
    fn a_catalog_records_the_encodings_of_its_logs_and_state_and_newer_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.json");
        Catalog::load(dir.path()).unwrap();
        let saved: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(saved["change_log_format"], crate::changelog::FORMAT);
        assert_eq!(saved["state_format"], crate::state::FORMAT);
        for (field, current) in [
            ("change_log_format", crate::changelog::FORMAT),
            ("state_format", crate::state::FORMAT),
        ] {
            let mut newer = saved.clone();
            newer[field] = (current + 1).into();
            std::fs::write(&path, newer.to_string()).unwrap();
            let e = Catalog::load(dir.path()).err().unwrap();
            assert_eq!(e.kind, ErrorKind::NotSupported, "{e}");
            assert!(
                e.message.contains(&format!("format {}", current + 1)),
                "{e}"
            );
        }
    }
}
