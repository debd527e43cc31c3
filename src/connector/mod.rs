//! Connectors: how data comes in from outside systems (`source`) and goes out to them
//! (`sink`). Each connector is a file behind its side's trait and registry; nothing outside
//! this module names one (`docs/design/0008-connectors.md`). Both sides read their options
//! through `Options`, and PostgreSQL's connectors share their connection (`postgres`).

mod options;
mod postgres;
pub mod sink;
pub mod source;

pub use self::options::Options;
