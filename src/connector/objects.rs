//! Object stores as connectors reach them: an `s3://bucket/prefix` URL with S3 options, for
//! files sources (`connector = 's3'`) and file sinks alike.

use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::ObjectStore;

use crate::error::{Error, ErrorKind, Result};

/// The bucket of an `s3://bucket/prefix` URL, configured by the usual `AWS_*` environment
/// variables and then by `options` (object_store's names: `endpoint`, `region`,
/// `access_key_id`, `secret_access_key`, `allow_http` ...), and the prefix, without its
/// trailing `/`.
pub fn s3(url: &str, options: &[(String, String)]) -> Result<(Arc<dyn ObjectStore>, String)> {
    let invalid = |m: String| Error::new(ErrorKind::InvalidParameter, m);
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| invalid(format!("path must be an s3:// URL, not \"{url}\"")))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(invalid(format!("path \"{url}\" names no bucket")));
    }
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    for (key, value) in options {
        let key: AmazonS3ConfigKey = key
            .parse()
            .map_err(|_| invalid(format!("unknown S3 option \"s3.{key}\"")))?;
        builder = builder.with_config(key, value);
    }
    let store = builder
        .build()
        .map_err(|e| invalid(format!("cannot configure S3: {e}")))?;
    Ok((Arc::new(store), prefix.trim_end_matches('/').to_string()))
}

/// An object store's failure: a missing object is 58P01, anything else the store being out
/// of reach (08006).
pub fn error(url: &str, what: &str, e: object_store::Error) -> Error {
    let kind = match e {
        object_store::Error::NotFound { .. } => ErrorKind::UndefinedFile,
        _ => ErrorKind::ConnectionFailure,
    };
    Error::new(kind, format!("could not {what} {url}: {e}"))
}
