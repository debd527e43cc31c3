//! Connectors: how data comes in from outside systems (`source`) and goes out to them
//! (`sink`). Each connector is a file behind its side's trait and registry; nothing outside
//! this module names one (`docs/design/0008-connectors.md`). Both sides read their options
//! through `Options`, PostgreSQL's connectors share their connection (`postgres`), and files'
//! connectors their object stores (`objects`).

mod objects;
mod options;
mod paths;
mod postgres;
mod postgres_tls;
pub mod sink;
pub mod source;

pub use self::options::Options;
pub use self::paths::FileAccess;

/// Checks that `access` lets its role use the server's files a new source's, table's
/// (`sink == false`) or sink's connector names (42501: `connector/paths.rs`).
pub fn check_server_files(
    connector: &crate::catalog::Connector,
    sink: bool,
    access: &FileAccess<'_>,
) -> crate::error::Result<()> {
    let paths = match sink {
        true => self::sink::connector(&connector.name)?.server_paths(&connector.options),
        false => self::source::connector(&connector.name)?.server_paths(&connector.options),
    };
    paths
        .into_iter()
        .try_for_each(|path| paths::check(path, access))
}
