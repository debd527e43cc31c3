//! The dataflow runtime: actors joined by bounded channels, carrying chunks and barriers.
//!
//! Each table and each materialized view runs as one actor. A table's actor reads the table's
//! change feed; a view's actor reads the changes of the relation it is defined on. Every actor
//! ends in a `Materialize` that keeps the relation's rows and feeds the views built on it.

pub mod actor;
pub mod align;
pub mod chunk;
pub mod coordinator;
pub mod expr;
pub mod message;
pub mod operator;
pub mod operators;
pub mod plan;
pub mod rows;
