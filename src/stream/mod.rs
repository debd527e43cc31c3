//! The dataflow runtime: actors joined by bounded channels, carrying chunks, watermarks and
//! barriers.
//!
//! Each table and each materialized view runs as one actor. A table's actor reads the table's
//! change feed; a view's actor reads the changes of every relation its query reads. Every
//! actor ends in a `Materialize` that keeps the relation's rows and feeds the views built on
//! it. `dispatch` holds the hash partitioning that parallel fragments will use
//! (`docs/design/0002-parallel-dataflow.md`).

pub mod actor;
pub mod align;
pub mod chunk;
pub mod coordinator;
pub mod dispatch;
pub mod expr;
pub mod graph;
pub mod message;
pub mod operator;
pub mod operators;
pub mod plan;
pub mod rows;
pub mod sink;
pub mod spec;
pub mod stored;

/// A relation's rows as its actor's `Materialize` keeps them, for readers outside the
/// dataflow: batch queries (`sql::provider`) and table writers (`table`).
pub mod relation {
    pub use super::operators::materialize::{
        read_added, read_snapshot_part, Materialize, RowChanges,
    };
}
