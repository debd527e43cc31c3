//! The incremental operators, one per file.

pub mod expand;
pub mod filter;
pub mod hash_agg;
pub mod join;
pub mod materialize;
pub mod project;
pub mod temporal_filter;
pub mod top_n;
pub mod union;
pub mod upsert;
