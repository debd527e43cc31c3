//! SQL front end: parsing (with time-window table functions rewritten into subqueries), DDL
//! analysis, DataFusion contexts over Weir's relations, and the compiler from logical plans to
//! incremental stream plans.
//!
//! Invariant: `sql/` does no I/O of its own; it reads state only through the snapshot
//! providers handed to DataFusion.

pub mod checked;
pub mod context;
pub mod ddl;
pub mod dialect;
pub mod dml;
pub mod extensions;
pub mod names;
pub mod parser;
pub mod provider;
pub mod rows;
pub mod rules;
pub mod stream_plan;
pub mod windows;
