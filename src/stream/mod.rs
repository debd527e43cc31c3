//! The dataflow runtime: actors joined by bounded channels, carrying chunks, watermarks and
//! barriers.
//!
//! Each table and each materialized view runs as one actor. A table's actor reads the table's
//! change feed; a view's actor reads the changes of every relation its query reads. Every
//! actor ends in a `Materialize` that keeps the relation's rows and feeds the views built on
//! it. `dispatch` holds the hash partitioning that parallel fragments will use
//! (`docs/design/0002-parallel-dataflow.md`).

mod actor;
mod align;
mod chunk;
mod coordinator;
mod dispatch;
mod expr;
pub mod graph;
mod message;
mod operator;
mod operators;
mod plan;
mod rows;
mod sink;
pub mod spec;
mod stored;
mod subscribe;

// The face the rest of Weir sees. Three modules are open: `spec` (the operators as the planner
// builds them), `graph` (a view's actors wired from its fragments) and `relation` (a
// relation's rows for readers outside the dataflow). The names below are the rest; everything
// else here is private to the dataflow.

/// What flows between actors: chunks of row changes, watermarks, barriers, and the feeds
/// that carry a relation's changes into an actor.
pub use self::chunk::{Op, StreamChunk};
pub use self::message::{
    ActorId, BackfillProgress, Backfills, Feed, FeedPosition, Mutation, Positions, Splits,
    Watermark, FEED_ROWS_MAX,
};

/// Plans and the actors built from them.
pub use self::actor::{ActorErrors, Batches, Dataflow, SourceHistory, SourceRows};
pub use self::plan::{build_actor, ActorContext, Fragment, PlanNode, StreamPlan};
pub use self::stored::{Compiled, Functions};

/// The barrier coordinator and the handle checkpoints and writers use.
pub use self::coordinator::{ActorEvent, BarrierClient, Coordinator, DurableSplits, FailedActors};

/// Row evaluation errors, the key codec of stored rows, and the vnode count of state keys.
pub use self::dispatch::VNODE_COUNT;
pub use self::expr::{ErrorSink, ERRORS_TABLE};
pub use self::rows::RowCodec;

/// What a sink connector implements, and the counts every sink keeps.
pub use self::sink::{
    deliver as deliver_sink, SinkDriver, SinkLog, SinkStart, SinkStatus, SinkWriter,
};

/// A subscription's changes, taken from a relation's actor an epoch at a time.
pub use self::subscribe::{net_epoch, subscribe, Change, Subscription};

/// A relation's rows as its actor's `Materialize` keeps them, for readers outside the
/// dataflow: batch queries (`sql::provider`) and table writers (`table`).
pub mod relation {
    pub use super::operators::materialize::{
        read_added_part, read_excess_part, read_snapshot_part, Changes, Materialize, RowChanges,
    };
}

/// Chunks from their pretty-printed form and a state store, for tests of other modules.
#[cfg(test)]
pub mod test_util {
    pub use super::chunk::test_util::{chunk, render_sorted, schema};
    pub use super::operator::test_util::Epochs;
}
