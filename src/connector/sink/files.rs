//! `connector = 'file'` (a local directory) and `connector = 's3'` (an `s3://bucket/prefix`): a
//! view's rows as new files, FORMAT PLAIN ENCODE PARQUET, JSON (one object a line) or CSV.
//! Each checkpoint's share of the sink's log becomes files named after the checkpoint's epoch,
//! `part-<epoch>-<n>.<ext>`, under Hive-style `column=value/` directories with `partition_by`
//! (the partition columns are then in the directories' names, not in the files). A delivery
//! makes its files visible exactly once, never half written (`docs/design/0015-file-sink.md`):
//!
//! 1. each file is written whole under `_weir/<sink>/tmp/`, which readers skip (Hive, Spark,
//!    pyarrow and Weir's own file source pass over `_`-prefixed names), at most
//!    `FILE_BYTES_MAX` bytes each;
//! 2. the delivery's commit record, `_weir/<sink>/<epoch>.commit`, lists each file's temporary
//!    and final name: from here on the delivery is decided;
//! 3. each file is renamed to its final name (on S3, copied and deleted);
//! 4. the marker `_weir/<sink>/delivered` takes the epoch, and the commit record goes.
//!
//! A restart reads the marker and finishes a commit record after it (steps 3 and 4, past the
//! files already renamed), so a file once visible stays and none appears twice. A delivery
//! that failed before its commit record leaves only temporary files, deleted when the next one
//! begins. A local directory's files and names are fsync'd before the step that relies on them.
//! A sink built again sends its view's rows anew: its first delivery's commit record also lists
//! the `part-*` files already in the directory, which publishing deletes first.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{BooleanArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{filter_record_batch, take_record_batch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::json::writer::{LineDelimited, WriterBuilder};
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use serde::{Deserialize, Serialize};

use super::{flag, Format, Options, Spec};
use crate::connector::objects;
use crate::db::CopyFormat;
use crate::error::{Error, ErrorKind, Result};
use crate::stream::{Op, SinkWriter, StreamChunk};

/// A files sink, by its connector's name: `file` or `s3`.
pub struct FileSink(&'static str);

/// `connector = 'file'`.
pub const FILES: FileSink = FileSink("file");

/// `connector = 's3'`.
pub const S3: FileSink = FileSink("s3");

/// A file is closed, and a new one begun, past this many bytes.
const FILE_BYTES_MAX: usize = 64 << 20;

/// At most this many bytes of a delivery's files are held in memory, and at most
/// `OPEN_FILES_MAX` files are open: past either, the largest open file is closed.
const BUFFER_BYTES_MAX: usize = 256 << 20;
const OPEN_FILES_MAX: usize = 64;

/// A partition column's value when it is NULL, as Hive names it.
const NULL_PARTITION: &str = "__HIVE_DEFAULT_PARTITION__";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encode {
    Parquet,
    Json,
    Csv,
}

impl Encode {
    fn name(self) -> &'static str {
        match self {
            Encode::Parquet => "parquet",
            Encode::Json => "json",
            Encode::Csv => "csv",
        }
    }
}

/// A file sink's options.
#[derive(Debug, Clone)]
struct Config {
    connector: &'static str,
    sink: String,
    /// An absolute directory (`file`) or an `s3://bucket/prefix` URL.
    path: String,
    /// `s3.<object_store option>` of an `s3` sink.
    s3: Vec<(String, String)>,
    encode: Encode,
    /// The columns whose values name the directories.
    partition_by: Vec<usize>,
    /// CSV files begin with a line of the columns' names.
    header: bool,
    /// The view's columns less the partition columns: each file's.
    file_columns: Vec<usize>,
}

fn bad(m: String) -> Error {
    Error::new(ErrorKind::InvalidParameter, m)
}

impl Config {
    fn read(
        connector: &'static str,
        sink: &str,
        options: &mut Options,
        spec: &Spec,
        schema: &SchemaRef,
    ) -> Result<Config> {
        let path = options
            .take("path")
            .ok_or_else(|| bad(format!("a {connector} sink needs a path")))?;
        let s3 = options.take_prefixed("s3.");
        if connector == "file" {
            if !path.starts_with('/') {
                return Err(Error::new(
                    ErrorKind::InvalidName,
                    format!("a file sink's path must be absolute, not \"{path}\""),
                ));
            }
            if let Some((key, _)) = s3.first() {
                return Err(bad(format!("unknown sink option \"s3.{key}\"")));
            }
        }
        if spec.format != Format::Plain {
            return Err(Error::not_supported(format!(
                "a {connector} sink writes FORMAT PLAIN: files only grow"
            ))
            .with_hint("Over a query that updates or deletes, add force_append_only = 'true'."));
        }
        let encode = match spec.encode.as_deref() {
            Some("parquet") => Encode::Parquet,
            Some("json") => Encode::Json,
            Some("csv") => Encode::Csv,
            Some(other) => {
                return Err(Error::not_supported(format!(
                    "a {connector} sink writes ENCODE PARQUET, JSON or CSV, not ENCODE {}",
                    other.to_uppercase()
                )))
            }
            None => {
                return Err(Error::syntax(format!(
                    "a {connector} sink needs FORMAT PLAIN ENCODE ..."
                ))
                .with_hint("For example: FORMAT PLAIN ENCODE PARQUET."))
            }
        };
        let partition_by = match options.take("partition_by") {
            Some(names) => super::columns(&names, schema)?,
            None => Vec::new(),
        };
        let header = flag("header", options.take("header"))?.unwrap_or(false);
        if header && encode != Encode::Csv {
            return Err(bad("header is an option of CSV files".into()));
        }
        let file_columns: Vec<usize> = (0..schema.fields().len())
            .filter(|c| !partition_by.contains(c))
            .collect();
        if file_columns.is_empty() {
            return Err(bad(
                "partition_by names every column: the files would hold nothing".into(),
            ));
        }
        Ok(Config {
            connector,
            sink: sink.to_string(),
            path,
            s3,
            encode,
            partition_by,
            header,
            file_columns,
        })
    }

    fn kept(&self, schema: &SchemaRef) -> Vec<(String, String)> {
        let mut kept = vec![("path".to_string(), self.path.clone())];
        if !self.partition_by.is_empty() {
            let names: Vec<&str> = (self.partition_by.iter())
                .map(|c| schema.field(*c).name().as_str())
                .collect();
            kept.push(("partition_by".into(), names.join(",")));
        }
        if self.encode == Encode::Csv {
            kept.push(("header".into(), self.header.to_string()));
        }
        for (k, v) in &self.s3 {
            kept.push((format!("s3.{k}"), v.clone()));
        }
        kept
    }

    /// The schema of the files: the view's less the partition columns.
    fn file_schema(&self, schema: &SchemaRef) -> Result<SchemaRef> {
        Ok(Arc::new(schema.project(&self.file_columns)?))
    }

    /// The store the files go to, and the local directory it is, if it is one (for fsync).
    fn store(&self) -> Result<(Arc<dyn ObjectStore>, Option<PathBuf>)> {
        if self.connector == "s3" {
            let (store, prefix) = objects::s3(&self.path, &self.s3)?;
            let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
                store
            } else {
                Arc::new(PrefixStore::new(store, prefix))
            };
            return Ok((store, None));
        }
        let root = PathBuf::from(&self.path);
        crate::blocking(|| std::fs::create_dir_all(&root)).map_err(|e| {
            Error::new(
                ErrorKind::UndefinedFile,
                format!("could not create directory \"{}\": {e}", self.path),
            )
        })?;
        let store = LocalFileSystem::new_with_prefix(&root)
            .map_err(|e| objects::error(&self.path, "open", e))?;
        Ok((Arc::new(store), Some(root)))
    }
}

/// `value` as a path segment: letters, digits, `.`, `-`, `_` and spaces as they are, any
/// other byte as `%XX` (as Hive escapes partition values).
fn escape(value: &[u8], dot: bool) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b' ') || (dot && *b == b'.') {
            out.push(*b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn parse_path(name: &str) -> Result<ObjectPath> {
    ObjectPath::parse(name).map_err(|e| Error::internal(format!("file sink path {name}: {e}")))
}

impl super::Connector for FileSink {
    fn name(&self) -> &'static str {
        self.0
    }

    fn default_format(&self, _keyed: bool) -> Option<Format> {
        Some(Format::Plain)
    }

    fn server_paths<'a>(&self, kept: &'a BTreeMap<String, String>) -> Vec<&'a str> {
        let path = (self.0 == "file").then(|| kept.get("path").map(String::as_str));
        path.flatten().into_iter().collect()
    }

    fn create(
        &self,
        name: &str,
        options: &mut Options,
        spec: &Spec,
        schema: &SchemaRef,
    ) -> Result<Vec<(String, String)>> {
        create(self.0, name, options, spec, schema)
    }

    fn open(
        &self,
        name: &str,
        options: &BTreeMap<String, String>,
        spec: &Spec,
        schema: &SchemaRef,
    ) -> Result<Box<dyn SinkWriter>> {
        open(self.0, name, options, spec, schema)
    }
}

/// Checks a new sink's options and that its files can hold the view's types, and starts the
/// sink over in its directory: what a dropped sink of the same name left of its own (its
/// marker, commit records and temporary files) is deleted. Its files stay.
fn create(
    connector: &'static str,
    name: &str,
    options: &mut Options,
    spec: &Spec,
    schema: &SchemaRef,
) -> Result<Vec<(String, String)>> {
    let config = Config::read(connector, name, options, spec, schema)?;
    Encoder::new(&config, &config.file_schema(schema)?)?;
    let writer = Writer::new(config.clone(), schema)?;
    let target = &writer.target;
    crate::wait(target.delete_under(&target.own("")))
        .map_err(|e| e.with_hint(format!("Check that Weir can write to {}.", config.path)))?;
    Ok(config.kept(schema))
}

fn open(
    connector: &'static str,
    name: &str,
    options: &BTreeMap<String, String>,
    spec: &Spec,
    schema: &SchemaRef,
) -> Result<Box<dyn SinkWriter>> {
    let mut options = Options::kept(options).of_sink();
    let config = Config::read(connector, name, &mut options, spec, schema)?;
    Ok(Box::new(Writer::new(config, schema)?))
}

/// One file being written, in memory.
enum Encoder {
    Parquet(Box<ArrowWriter<Vec<u8>>>),
    /// JSON and CSV: the lines so far.
    Lines(Vec<u8>),
}

impl Encoder {
    fn new(config: &Config, schema: &SchemaRef) -> Result<Encoder> {
        Ok(match config.encode {
            Encode::Parquet => {
                let props = WriterProperties::builder()
                    .set_compression(Compression::SNAPPY)
                    .build();
                let writer = ArrowWriter::try_new(Vec::new(), schema.clone(), Some(props))
                    .map_err(|e| {
                        Error::not_supported(format!("Parquet cannot hold this sink's rows: {e}"))
                    })?;
                Encoder::Parquet(Box::new(writer))
            }
            Encode::Json => Encoder::Lines(Vec::new()),
            Encode::Csv => {
                let mut lines = Vec::new();
                if config.header {
                    let names: Vec<String> =
                        schema.fields().iter().map(|f| f.name().clone()).collect();
                    lines = crate::server::copy_header(&names, &csv_format());
                }
                Encoder::Lines(lines)
            }
        })
    }

    fn write(&mut self, encode: Encode, batch: &RecordBatch) -> Result<()> {
        match self {
            Encoder::Parquet(w) => w
                .write(batch)
                .map_err(|e| Error::internal(format!("writing Parquet: {e}"))),
            Encoder::Lines(out) if encode == Encode::Json => {
                let mut w = WriterBuilder::new()
                    .with_explicit_nulls(true)
                    .build::<_, LineDelimited>(&mut *out);
                w.write(batch)?;
                w.finish()?;
                Ok(())
            }
            Encoder::Lines(out) => {
                for line in crate::server::copy_lines(batch, &csv_format())? {
                    out.extend_from_slice(&line);
                }
                Ok(())
            }
        }
    }

    /// The bytes held so far.
    fn size(&self) -> usize {
        match self {
            Encoder::Parquet(w) => w.bytes_written() + w.in_progress_size(),
            Encoder::Lines(out) => out.len(),
        }
    }

    fn finish(self) -> Result<Vec<u8>> {
        match self {
            Encoder::Parquet(w) => w
                .into_inner()
                .map_err(|e| Error::internal(format!("writing Parquet: {e}"))),
            Encoder::Lines(out) => Ok(out),
        }
    }
}

fn csv_format() -> CopyFormat {
    CopyFormat::csv()
}

/// A delivery's decision: each file's temporary and final name.
#[derive(Debug, Serialize, Deserialize)]
struct CommitRecord {
    epoch: u64,
    files: Vec<(String, String)>,
    /// Files the delivery takes the place of (a sink built again sends its view's rows anew):
    /// deleted before the new ones are renamed.
    #[serde(default)]
    replaces: Vec<String>,
}

/// Where a sink's files go: the store, and the sink's own objects in it.
struct Target {
    store: Arc<dyn ObjectStore>,
    /// The local directory the store is, for fsync.
    root: Option<PathBuf>,
    /// The sink's `path`, for messages.
    path: String,
    /// `_weir/<sink>/`.
    own: String,
}

impl Target {
    /// The name of `rest` among the sink's own objects: `_weir/<sink>/<rest>`.
    fn own(&self, rest: &str) -> String {
        format!("{}{rest}", self.own)
    }

    fn failed(&self, what: &str) -> impl Fn(object_store::Error) -> Error + '_ {
        let what = what.to_string();
        move |e| objects::error(&self.path, &what, e)
    }

    /// Makes `names` (and the directories naming them) durable, in a local directory.
    fn sync(&self, names: &[&str]) -> Result<()> {
        let Some(root) = &self.root else {
            return Ok(());
        };
        crate::blocking(|| {
            let mut dirs = std::collections::BTreeSet::new();
            for name in names {
                let path = root.join(name);
                std::fs::File::open(&path)?.sync_all()?;
                if let Some(dir) = path.parent() {
                    dirs.insert(dir.to_path_buf());
                }
            }
            for dir in dirs {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        })
    }

    async fn put(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        self.store
            .put(&parse_path(name)?, PutPayload::from(Bytes::from(bytes)))
            .await
            .map_err(self.failed(&format!("write {name} in")))?;
        self.sync(&[name])
    }

    /// Deletes every object whose name starts with `prefix`.
    async fn delete_under(&self, prefix: &str) -> Result<()> {
        let under = parse_path(prefix.trim_end_matches('/'))?;
        let names: Vec<ObjectPath> = self
            .store
            .list(Some(&under))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .map_err(self.failed("list"))?;
        for name in names {
            self.delete(&name).await?;
        }
        Ok(())
    }

    /// Deletes object `name`; one already gone is no error.
    async fn delete(&self, name: &ObjectPath) -> Result<()> {
        match self.store.delete(name).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.failed(&format!("delete {name} in"))(e)),
        }
    }

    /// Object `name`'s bytes (`what` it is, for errors); `None` when there is none.
    async fn read(&self, name: &str, what: &str) -> Result<Option<Bytes>> {
        let failed = self.failed(&format!("read {what} in"));
        match self.store.get(&parse_path(name)?).await {
            Ok(got) => Ok(Some(got.bytes().await.map_err(failed)?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(failed(e)),
        }
    }

    /// The sink's data files in its directory: every `part-<epoch>-<n>.<ext>` outside
    /// `_weir/`, in any partition directory.
    async fn data_files(&self, encode: Encode) -> Result<Vec<String>> {
        let names: Vec<String> = self
            .store
            .list(None)
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .map_err(self.failed("list"))?;
        let suffix = format!(".{}", encode.name());
        Ok(names
            .into_iter()
            .filter(|n| {
                let file = n.rsplit('/').next().unwrap_or(n);
                !n.starts_with("_weir/") && file.starts_with("part-") && file.ends_with(&suffix)
            })
            .collect())
    }

    /// The epoch the marker holds.
    async fn marker(&self) -> Result<Option<u64>> {
        let name = self.own("delivered");
        let Some(bytes) = self.read(&name, "the marker").await? else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&bytes);
        text.trim().parse::<u64>().map(Some).map_err(|_| {
            Error::new(
                ErrorKind::DataCorruption,
                format!("the file sink's marker {name} holds \"{text}\", not an epoch"),
            )
        })
    }

    /// The commit records left, by epoch.
    async fn commit_records(&self) -> Result<BTreeMap<u64, String>> {
        let own = self.own("");
        let names: Vec<String> = self
            .store
            .list(Some(&parse_path(own.trim_end_matches('/'))?))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .map_err(self.failed("list"))?;
        Ok(names
            .into_iter()
            .filter_map(|n| {
                let epoch = n
                    .strip_prefix(&own)?
                    .strip_suffix(".commit")?
                    .parse()
                    .ok()?;
                Some((epoch, n))
            })
            .collect())
    }

    /// Steps 3 and 4 of a decided delivery: each file under its final name, then the marker.
    async fn publish(&self, record: &CommitRecord, record_name: &str) -> Result<()> {
        crate::failpoint::reach("sink.file.before_publish").await;
        for name in &record.replaces {
            self.delete(&parse_path(name)?).await?;
        }
        let mut finals = Vec::with_capacity(record.files.len());
        for (temp, last) in &record.files {
            let (from, to) = (parse_path(temp)?, parse_path(last)?);
            crate::failpoint::io("sink.file.rename")?;
            match self.store.rename(&from, &to).await {
                Ok(()) => {}
                // Renamed before a crash: the file must be there.
                Err(object_store::Error::NotFound { .. }) => {
                    self.store.head(&to).await.map_err(|e| {
                        Error::new(
                            ErrorKind::DataCorruption,
                            format!(
                                "file {last} of the sink's checkpoint {} is gone: {e}",
                                record.epoch
                            ),
                        )
                    })?;
                }
                Err(e) => return Err(self.failed(&format!("rename {temp} to {last} in"))(e)),
            }
            finals.push(last.as_str());
        }
        self.sync(&finals)?;
        crate::failpoint::reach("sink.file.before_marker").await;
        self.put(
            &self.own("delivered"),
            record.epoch.to_string().into_bytes(),
        )
        .await?;
        self.delete(&parse_path(record_name)?).await
    }
}

/// Delivers a sink's checkpoints as files.
struct Writer {
    config: Config,
    schema: SchemaRef,
    file_schema: SchemaRef,
    target: Target,
    /// The delivery under way: its epoch, its files open by directory, and those written.
    epoch: u64,
    open: BTreeMap<String, Encoder>,
    written: Vec<(String, String)>,
    /// The delivery takes the place of every file the sink wrote before.
    replace: bool,
}

impl Writer {
    fn new(config: Config, schema: &SchemaRef) -> Result<Writer> {
        let (store, root) = config.store()?;
        Ok(Writer {
            file_schema: config.file_schema(schema)?,
            schema: schema.clone(),
            target: Target {
                store,
                root,
                path: config.path.clone(),
                own: format!("_weir/{}/", escape(config.sink.as_bytes(), false)),
            },
            config,
            epoch: 0,
            open: BTreeMap::new(),
            written: Vec::new(),
            replace: false,
        })
    }

    /// Steps 1 and 2: every file written under its temporary name, then the commit record.
    async fn decide(&mut self, epoch: u64) -> Result<(CommitRecord, String)> {
        let dirs: Vec<String> = self.open.keys().cloned().collect();
        for dir in dirs {
            self.close(&dir).await?;
        }
        let replaces = match self.replace {
            true => self.target.data_files(self.config.encode).await?,
            false => Vec::new(),
        };
        let record = CommitRecord {
            epoch,
            files: std::mem::take(&mut self.written),
            replaces,
        };
        let name = self.target.own(&format!("{epoch}.commit"));
        let bytes = serde_json::to_vec(&record)
            .map_err(|e| Error::internal(format!("encoding a commit record: {e}")))?;
        self.target.put(&name, bytes).await?;
        Ok((record, name))
    }

    /// Closes the open file of directory `dir` and writes it under a temporary name.
    async fn close(&mut self, dir: &str) -> Result<()> {
        let Some(encoder) = self.open.remove(dir) else {
            return Ok(());
        };
        let bytes = crate::blocking(|| encoder.finish())?;
        let n = self.written.len();
        let temp = self.target.own(&format!("tmp/{}-{n}", self.epoch));
        let name = format!(
            "{dir}part-{:020}-{n:05}.{}",
            self.epoch,
            self.config.encode.name()
        );
        self.target.put(&temp, bytes).await?;
        self.written.push((temp, name));
        Ok(())
    }

    /// The directory of each row of `batch` (`column=value/...`, or "" unpartitioned), with
    /// the rows of each, in the order the directories first appear.
    fn partitions(&self, batch: &RecordBatch) -> Result<Vec<(String, Vec<u32>)>> {
        if self.config.partition_by.is_empty() {
            return Ok(vec![(
                String::new(),
                (0..batch.num_rows() as u32).collect(),
            )]);
        }
        let mut order: Vec<(String, Vec<u32>)> = Vec::new();
        let mut at: std::collections::HashMap<String, usize> = Default::default();
        let mut value = Vec::new();
        for row in 0..batch.num_rows() {
            let mut dir = String::new();
            for c in &self.config.partition_by {
                let name = self.schema.field(*c).name();
                value.clear();
                let text = if crate::server::text_value(batch.column(*c), row, &mut value)? {
                    escape(&value, true)
                } else {
                    NULL_PARTITION.to_string()
                };
                dir.push_str(&format!("{}={text}/", escape(name.as_bytes(), true)));
            }
            let i = *at.entry(dir.clone()).or_insert_with(|| {
                order.push((dir, Vec::new()));
                order.len() - 1
            });
            order[i].1.push(row as u32);
        }
        Ok(order)
    }

    /// Adds `batch`'s rows to directory `dir`'s open file, closing files past the bounds.
    async fn append(&mut self, dir: String, batch: RecordBatch) -> Result<()> {
        if !self.open.contains_key(&dir) {
            let encoder = Encoder::new(&self.config, &self.file_schema)?;
            self.open.insert(dir.clone(), encoder);
        }
        let encode = self.config.encode;
        let size = match self.open.get_mut(&dir) {
            Some(encoder) => {
                encoder.write(encode, &batch)?;
                encoder.size()
            }
            None => return Err(Error::internal("a file sink's file is not open")),
        };
        if size >= FILE_BYTES_MAX {
            self.close(&dir).await?;
        }
        loop {
            let held: usize = self.open.values().map(Encoder::size).sum();
            if held <= BUFFER_BYTES_MAX && self.open.len() <= OPEN_FILES_MAX {
                return Ok(());
            }
            let largest = self.open.iter().max_by_key(|(_, e)| e.size());
            let Some(largest) = largest.map(|(d, _)| d.clone()) else {
                return Ok(());
            };
            self.close(&largest).await?;
        }
    }
}

#[async_trait::async_trait]
impl SinkWriter for Writer {
    async fn delivered(&mut self) -> Result<Option<u64>> {
        self.open.clear();
        self.written.clear();
        let mut delivered = self.target.marker().await?;
        for (epoch, name) in self.target.commit_records().await? {
            if delivered.is_some_and(|d| epoch <= d) {
                // Published; only the record's deletion was cut short.
                self.target.delete(&parse_path(&name)?).await?;
                continue;
            }
            let bytes = (self.target.read(&name, "the commit record").await?).ok_or_else(|| {
                Error::new(
                    ErrorKind::UndefinedFile,
                    format!("the file sink's commit record {name} is gone"),
                )
            })?;
            let record: CommitRecord = serde_json::from_slice(&bytes).map_err(|e| {
                Error::new(
                    ErrorKind::DataCorruption,
                    format!("the file sink's commit record {name}: {e}"),
                )
            })?;
            self.target.publish(&record, &name).await?;
            delivered = Some(epoch);
        }
        Ok(delivered)
    }

    async fn begin(&mut self, epoch: u64, replace: bool) -> Result<()> {
        self.replace = replace;
        self.open.clear();
        self.written.clear();
        self.epoch = epoch;
        self.target.delete_under(&self.target.own("tmp/")).await
    }

    async fn write(&mut self, chunk: StreamChunk) -> Result<()> {
        // FORMAT PLAIN: deletes are dropped (`force_append_only`).
        let data = if chunk.ops.iter().all(|o| *o == Op::Insert) {
            chunk.data
        } else {
            let inserts: BooleanArray = chunk.ops.iter().map(|o| Some(*o == Op::Insert)).collect();
            filter_record_batch(&chunk.data, &inserts)?
        };
        if data.num_rows() == 0 {
            return Ok(());
        }
        for (dir, rows) in self.partitions(&data)? {
            let rows = if rows.len() == data.num_rows() {
                data.clone()
            } else {
                take_record_batch(&data, &UInt32Array::from(rows))?
            };
            let columns = (self.config.file_columns.iter())
                .map(|c| rows.column(*c).clone())
                .collect();
            let batch = RecordBatch::try_new(self.file_schema.clone(), columns)?;
            self.append(dir, batch).await?;
        }
        Ok(())
    }

    async fn commit(&mut self, epoch: u64) -> Result<()> {
        let (record, name) = self.decide(epoch).await?;
        self.target.publish(&record, &name).await
    }
}

#[cfg(test)]
mod tests;
