//! Files as a source's rows: `connector = 'file'` reads a local file or directory,
//! `connector = 's3'` the objects under an S3 (or S3-compatible) prefix. Their files are read
//! in name order, one after the other, as CSV (`ENCODE CSV`), newline-delimited JSON
//! (`ENCODE JSON`) or Parquet (`ENCODE PARQUET`), by Arrow's readers (`reader`); where they are is a `store`. The source's
//! position is the file and byte where the last row it fed ends, so a restart reads on from
//! there. Files are read again after a restart and for a view created later, so they must be
//! the same: the `ledger` records each file the source starts and refuses one that changed.
//! With `refresh.interval.sec`, a source whose files are read lists them again for new ones
//! (which must sort after those read) instead of ending.
//!
//! `ENCODE PARQUET` reads Parquet files with Arrow's Parquet reader, by row: a file is opened
//! whole (an object downloaded whole, at most 256 MiB), its rows read a batch at a time, each
//! column by name and cast to the declared type, and the position is the file and its row.

mod ledger;
mod reader;
mod store;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use self::ledger::FileLedger;
use self::reader::{FilesReader, Format};
use self::store::Store;
use super::decode::Encode;
use super::{Keep, Options, Start};
use crate::catalog::{ColumnDef, ObjectId, SourceDef};
use crate::error::{Error, ErrorKind, Result};
use crate::wait;

/// `connector = 'file'`.
pub struct Files;

/// `connector = 's3'`.
pub struct S3;

/// A files source's options.
struct Config {
    path: String,
    encode: Encode,
    header: bool,
    /// Seconds between listings once every file is read; 0: the source ends with its files.
    refresh_secs: u64,
    /// `s3.<object_store option>` for an `s3` source.
    s3: Vec<(String, String)>,
}

impl Config {
    fn read(options: &mut Options, connector: &str) -> Result<Config> {
        let path = options.take("path").ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidParameter,
                format!("a {connector} source needs a path"),
            )
        })?;
        // `FORMAT PLAIN ENCODE CSV`; `format = 'csv'` as before that clause.
        let format = options.take("format").map(|f| f.to_lowercase());
        let encode = options.take("encode").map(|e| e.to_lowercase());
        let encode = match (format.as_deref(), encode.as_deref()) {
            (None | Some("plain"), None | Some("csv")) | (Some("csv"), None) => Encode::Csv,
            (None | Some("plain"), Some("json")) => Encode::Json,
            (None | Some("plain"), Some("parquet")) => Encode::Parquet,
            _ => {
                return Err(Error::not_supported(format!(
                    "{connector} sources read FORMAT PLAIN ENCODE CSV, JSON or PARQUET, not \
                     FORMAT {} ENCODE {}",
                    format.as_deref().unwrap_or("plain").to_uppercase(),
                    encode.as_deref().unwrap_or("csv").to_uppercase()
                )))
            }
        };
        let header = super::flag("header", options.take("header"))?.unwrap_or(false);
        if header && encode != Encode::Csv {
            return Err(Error::new(
                ErrorKind::InvalidParameter,
                "header is an option of CSV files",
            ));
        }
        let refresh_secs =
            super::count("refresh.interval.sec", options.take("refresh.interval.sec"))?
                .unwrap_or(0);
        let s3 = options.take_prefixed("s3.");
        if connector == "file" && !s3.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidParameter,
                format!("unknown source option \"s3.{}\"", s3[0].0),
            ));
        }
        Ok(Config {
            path,
            encode,
            header,
            refresh_secs,
            s3,
        })
    }

    fn kept(&self) -> BTreeMap<String, String> {
        let mut kept = BTreeMap::from([
            ("path".to_string(), self.path.clone()),
            ("encode".to_string(), self.encode.name().to_string()),
            ("header".to_string(), self.header.to_string()),
            (
                "refresh.interval.sec".to_string(),
                self.refresh_secs.to_string(),
            ),
        ]);
        for (k, v) in &self.s3 {
            kept.insert(format!("s3.{k}"), v.clone());
        }
        kept
    }

    fn store(&self, connector: &str) -> Result<Store> {
        match connector {
            "s3" => Store::s3(&self.path, &self.s3),
            _ => Ok(Store::local(&self.path)),
        }
    }

    fn format(&self, def: &SourceDef) -> Format {
        Format {
            encode: self.encode,
            header: self.header,
            schema: def.schema(),
            extensions: extensions(self.encode),
        }
    }
}

/// The names of the files an encoding's source reads end so.
fn extensions(encode: Encode) -> &'static [&'static str] {
    match encode {
        Encode::Csv => &[".csv"],
        Encode::Json => &[".json", ".jsonl", ".ndjson"],
        Encode::Parquet => &[".parquet"],
    }
}

fn create(
    connector: &str,
    options: &mut Options,
    declared: Vec<ColumnDef>,
    table: Option<&[usize]>,
) -> Result<(BTreeMap<String, String>, Vec<ColumnDef>)> {
    super::sources_only(connector, table)?;
    let config = Config::read(options, connector)?;
    if declared.is_empty() {
        return Err(Error::new(
            ErrorKind::InvalidParameter,
            format!("a {connector} source needs its columns declared"),
        ));
    }
    let store = config.store(connector)?;
    let extensions = extensions(config.encode);
    let listed = wait(store.list(extensions))?;
    // A local source that will not look again must have something to read.
    if listed.is_empty() && config.refresh_secs == 0 && connector == "file" {
        return Err(Error::new(
            ErrorKind::UndefinedFile,
            format!(
                "\"{}\" holds no {} file",
                store.describe(),
                extensions.join(" or ")
            ),
        ));
    }
    Ok((config.kept(), declared))
}

fn open(
    connector: &str,
    def: &SourceDef,
    start: Start<'_>,
    keep: Option<Keep<'_>>,
) -> Result<Box<dyn super::Reader>> {
    let config = Config::read(&mut Options::kept(&def.connector.options), connector)?;
    let ledger = keep
        .map(|k| Ok::<_, Error>((FileLedger::open(k.dir, def.id, k.own)?, k.checked)))
        .transpose()?;
    // Only the source's own reader looks for new files; one reading again stops where the
    // source was.
    let own = keep.is_none_or(|k| k.own);
    let refresh =
        (own && config.refresh_secs > 0).then(|| Duration::from_secs(config.refresh_secs));
    let reader = wait(FilesReader::open(
        config.store(connector)?,
        config.format(def),
        start,
        ledger,
        refresh,
    ))?;
    Ok(Box::new(reader))
}

impl super::Connector for Files {
    fn name(&self) -> &'static str {
        "file"
    }

    fn create(
        &self,
        options: &mut Options,
        declared: Vec<ColumnDef>,
        table: Option<&[usize]>,
    ) -> Result<(BTreeMap<String, String>, Vec<ColumnDef>)> {
        create("file", options, declared, table)
    }

    fn open(
        &self,
        def: &SourceDef,
        start: Start<'_>,
        keep: Option<Keep<'_>>,
    ) -> Result<Box<dyn super::Reader>> {
        open("file", def, start, keep)
    }

    fn forget(&self, dir: &Path, id: ObjectId) -> Result<()> {
        FileLedger::remove(dir, id)
    }

    fn server_paths<'a>(&self, kept: &'a BTreeMap<String, String>) -> Vec<&'a str> {
        kept.get("path").map(String::as_str).into_iter().collect()
    }
}

impl super::Connector for S3 {
    fn name(&self) -> &'static str {
        "s3"
    }

    fn create(
        &self,
        options: &mut Options,
        declared: Vec<ColumnDef>,
        table: Option<&[usize]>,
    ) -> Result<(BTreeMap<String, String>, Vec<ColumnDef>)> {
        create("s3", options, declared, table)
    }

    fn open(
        &self,
        def: &SourceDef,
        start: Start<'_>,
        keep: Option<Keep<'_>>,
    ) -> Result<Box<dyn super::Reader>> {
        open("s3", def, start, keep)
    }

    fn forget(&self, dir: &Path, id: ObjectId) -> Result<()> {
        FileLedger::remove(dir, id)
    }
}
