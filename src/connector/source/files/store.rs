//! Where a files source's files are: a local path (one file, or a directory) or an object
//! store's prefix (`s3://bucket/prefix/`, through object_store). Both list their files, in name
//! order, with what identifies a version of each (size, modification time), and read one from
//! a byte on, a chunk at a time.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore};

use crate::error::{Error, ErrorKind, Result};

/// How many bytes a local file is read by at a time.
const CHUNK_BYTES: usize = 1 << 20;

/// A file of a source, as the listing found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its name: the file name, or the object's key below the prefix.
    pub name: String,
    pub size: u64,
    pub modified_ns: u64,
}

#[derive(Clone)]
pub enum Store {
    /// A file, or a directory whose files are the source's.
    Local(PathBuf),
    /// The objects under a prefix.
    Remote {
        store: Arc<dyn ObjectStore>,
        prefix: String,
        url: String,
    },
}

/// The most bytes of a Parquet object read from an object store (it is read whole: its
/// footer, at its end, says where its rows are).
const PARQUET_OBJECT_BYTES_MAX: u64 = 256 << 20;

/// A whole file, for a reader that seeks in it (Parquet's).
pub enum Whole {
    Local(std::fs::File),
    Remote(Bytes),
}

/// Bytes of one file, from a byte on.
pub enum Input {
    Local(std::fs::File),
    Remote(BoxStream<'static, object_store::Result<Bytes>>),
}

fn missing(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::UndefinedFile,
        format!("could not open \"{what}\": {e}"),
    )
}

impl Store {
    /// A local path.
    pub fn local(path: &str) -> Store {
        Store::Local(PathBuf::from(path))
    }

    /// An `s3://bucket/prefix` URL with S3 options (`connector::objects::s3`).
    pub fn s3(url: &str, options: &[(String, String)]) -> Result<Store> {
        let (store, prefix) = crate::connector::objects::s3(url, options)?;
        Ok(Store::Remote {
            store,
            prefix,
            url: url.to_string(),
        })
    }

    /// The files whose names end with one of `extensions`, in name order. A missing local
    /// path is an error (58P01); a missing prefix has no files.
    pub async fn list(&self, extensions: &[&str]) -> Result<Vec<Listed>> {
        let wanted = |name: &str| extensions.iter().any(|e| name.ends_with(e));
        let mut found = match self {
            Store::Local(path) => {
                let path = path.clone();
                let extensions: Vec<String> = extensions.iter().map(|e| e.to_string()).collect();
                crate::blocking(move || list_local(&path, &extensions))?
            }
            Store::Remote {
                store, prefix, url, ..
            } => {
                let under = (!prefix.is_empty()).then(|| ObjectPath::from(prefix.as_str()));
                let objects: Vec<object_store::ObjectMeta> = store
                    .list(under.as_ref())
                    .try_collect()
                    .await
                    .map_err(|e| unreachable(url, e))?;
                objects
                    .into_iter()
                    .filter_map(|o| {
                        let key = o.location.to_string();
                        let name = key
                            .strip_prefix(prefix.as_str())
                            .unwrap_or(&key)
                            .trim_start_matches('/')
                            .to_string();
                        wanted(&name).then(|| Listed {
                            name,
                            size: o.size,
                            modified_ns: o
                                .last_modified
                                .timestamp_nanos_opt()
                                .unwrap_or_default()
                                .max(0) as u64,
                        })
                    })
                    .collect()
            }
        };
        found.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(found)
    }

    /// File `name`'s bytes from `byte` on.
    pub async fn open(&self, name: &str, byte: u64) -> Result<Input> {
        match self {
            Store::Local(path) => {
                let path = if path.is_dir() {
                    path.join(name)
                } else {
                    path.clone()
                };
                crate::blocking(|| {
                    let mut file = open_regular(&path)?;
                    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(byte))?;
                    Ok(Input::Local(file))
                })
            }
            Store::Remote {
                store, prefix, url, ..
            } => {
                let key = if prefix.is_empty() {
                    name.to_string()
                } else {
                    format!("{prefix}/{name}")
                };
                let options = GetOptions {
                    range: (byte > 0).then_some(GetRange::Offset(byte)),
                    ..Default::default()
                };
                let got = store
                    .get_opts(&ObjectPath::from(key.as_str()), options)
                    .await
                    .map_err(|e| unreachable(url, e))?;
                Ok(Input::Remote(got.into_stream()))
            }
        }
    }

    /// File `name` whole, for a reader that seeks in it; an object larger than
    /// `PARQUET_OBJECT_BYTES_MAX` is refused (54000).
    pub async fn open_whole(&self, name: &str, size: u64) -> Result<Whole> {
        match self {
            Store::Local(path) => {
                let path = if path.is_dir() {
                    path.join(name)
                } else {
                    path.clone()
                };
                crate::blocking(|| Ok(Whole::Local(open_regular(&path)?)))
            }
            Store::Remote { store, prefix, url } => {
                if size > PARQUET_OBJECT_BYTES_MAX {
                    return Err(Error::new(
                        ErrorKind::ProgramLimitExceeded,
                        format!(
                            "object \"{name}\" has {size} bytes: a Parquet object is read whole, \
                             and may have at most {PARQUET_OBJECT_BYTES_MAX}"
                        ),
                    )
                    .with_hint("Write smaller Parquet files (fewer row groups each)."));
                }
                let key = if prefix.is_empty() {
                    name.to_string()
                } else {
                    format!("{prefix}/{name}")
                };
                let bytes = store
                    .get_opts(&ObjectPath::from(key.as_str()), GetOptions::default())
                    .await
                    .map_err(|e| unreachable(url, e))?
                    .bytes()
                    .await
                    .map_err(|e| unreachable(url, e))?;
                Ok(Whole::Remote(bytes))
            }
        }
    }

    /// Where the files are, for messages.
    pub fn describe(&self) -> String {
        match self {
            Store::Local(p) => p.display().to_string(),
            Store::Remote { url, .. } => url.clone(),
        }
    }

    /// Where file `name` (as listed) is, for errors a user reads: its path, or its object's
    /// URL. A source's single file is listed under its own name; a directory's files under
    /// theirs.
    pub fn locate(&self, name: &str) -> String {
        match self {
            Store::Local(p) if p.file_name().is_some_and(|n| n == name) => p.display().to_string(),
            Store::Local(p) => p.join(name).display().to_string(),
            Store::Remote { url, .. } => format!("{}/{name}", url.trim_end_matches('/')),
        }
    }
}

impl Input {
    /// The next bytes; `None` at the file's end.
    pub async fn next(&mut self) -> Result<Option<Bytes>> {
        match self {
            Input::Local(file) => crate::blocking(|| {
                let mut buf = vec![0u8; CHUNK_BYTES];
                let n = std::io::Read::read(file, &mut buf)?;
                buf.truncate(n);
                Ok((n > 0).then(|| Bytes::from(buf)))
            }),
            Input::Remote(stream) => stream
                .next()
                .await
                .transpose()
                .map_err(|e| unreachable("the object store", e)),
        }
    }
}

fn unreachable(url: &str, e: object_store::Error) -> Error {
    crate::connector::objects::error(url, "read", e)
}

fn list_local(path: &Path, extensions: &[String]) -> Result<Vec<Listed>> {
    let stat = |p: &Path, meta: &std::fs::Metadata| Listed {
        name: p.file_name().map_or_else(
            || p.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ),
        size: meta.len(),
        modified_ns: meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as u64),
    };
    let meta = std::fs::metadata(path).map_err(|e| missing(&path.display().to_string(), e))?;
    if meta.is_file() {
        return Ok(vec![stat(path, &meta)]);
    }
    if !meta.is_dir() {
        return Err(not_a_file(path));
    }
    let mut found = Vec::new();
    for entry in std::fs::read_dir(path).map_err(|e| missing(&path.display().to_string(), e))? {
        let p = entry?.path();
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.is_some_and(|n| extensions.iter().any(|e| n.ends_with(e.as_str()))) {
            let meta = std::fs::metadata(&p)?;
            if meta.is_file() {
                found.push(stat(&p, &meta));
            }
        }
    }
    Ok(found)
}

/// A FIFO, a device or a socket: reading one could wait for ever (a FIFO without a writer)
/// or never end (`/dev/zero`).
fn not_a_file(path: &Path) -> Error {
    Error::new(
        ErrorKind::WrongObjectType,
        format!("\"{}\" is not a regular file or directory", path.display()),
    )
    .with_hint("A file source reads regular files: one file, or a directory of them.")
}

/// Opens a file to read without waiting (a FIFO put in a file's place since it was listed
/// would make a plain open wait for a writer), and only if it is a regular file.
fn open_regular(path: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| missing(&path.display().to_string(), e))?;
    if !file.metadata()?.is_file() {
        return Err(not_a_file(path));
    }
    Ok(file)
}
