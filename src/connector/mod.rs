//! Connectors: how data comes in from outside systems (`source`) and goes out to them
//! (`sink`). Each connector is a file behind its side's trait and registry; nothing outside
//! this module names one (`docs/design/0008-connectors.md`). Both sides read their options
//! through `Options`, PostgreSQL's connectors share their connection (`postgres`), and files'
//! connectors their object stores (`objects`).

mod objects;
mod options;
mod postgres;
pub mod sink;
pub mod source;

pub use self::options::Options;
