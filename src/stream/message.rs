//! What flows on the channels between actors: chunks of changes, watermarks and barriers.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::mpsc;

use super::chunk::StreamChunk;
use super::dispatch::Partitioner;

/// Identifies an actor. Each table and each view runs as one actor whose id is the catalog id
/// of the object.
pub type ActorId = u32;

#[derive(Debug, Clone)]
pub enum Message {
    Chunk(StreamChunk),
    Barrier(Barrier),
    Watermark(Watermark),
}

/// No row arriving after this on the channel has a value below `value` in column `column`
/// (event time, in microseconds since the Unix epoch). Changes to rows below it may still come
/// (a table accepts any statement); operators that emit on window close ignore them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermark {
    pub column: usize,
    pub value: i64,
}

/// Ends epoch `epoch` on the channel it travels: every chunk sent before it belongs to that
/// epoch or an earlier one, every chunk after it to a later one.
#[derive(Debug, Clone)]
pub struct Barrier {
    pub epoch: u64,
    /// The coordinator's clock when it injected the barrier (microseconds since the Unix
    /// epoch): `now()` for the rows of this epoch.
    pub time_us: i64,
    pub kind: BarrierKind,
    /// A change to the dataflow that takes effect at this barrier, everywhere at once.
    pub mutation: Option<Arc<Mutation>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarrierKind {
    Regular,
    /// Reserved for checkpoint barriers: state is also persisted to the object store.
    Checkpoint,
}

#[derive(Debug, Default)]
pub struct Mutation {
    /// New downstream channels, by the upstream actor that must feed them. An upstream sends
    /// its current contents first (backfill), then every later change.
    pub add_outputs: HashMap<ActorId, Vec<NewOutput>>,
    /// Actors that stop after this barrier: upstreams stop feeding them, and their state is
    /// dropped.
    pub stop: HashSet<ActorId>,
}

/// A downstream actor and the channel to it.
pub type Target = (ActorId, mpsc::Sender<Message>);

/// An actor's output: a channel to one downstream actor, or a hash exchange to the actors of
/// a parallel fragment.
#[derive(Debug, Clone)]
pub struct NewOutput {
    /// The downstream actors and their channels, in the order of the fragment's actors.
    pub targets: Vec<Target>,
    /// How chunks are split among `targets`; `None`: all to the one target. Barriers and
    /// watermarks go to every target.
    pub partitioner: Option<Arc<Partitioner>>,
}

impl NewOutput {
    pub fn to(downstream: ActorId, sender: mpsc::Sender<Message>) -> NewOutput {
        NewOutput {
            targets: vec![(downstream, sender)],
            partitioner: None,
        }
    }

    pub fn feeds(&self, actor: ActorId) -> bool {
        self.targets.iter().any(|(a, _)| *a == actor)
    }
}

impl Barrier {
    pub fn stops(&self, actor: ActorId) -> bool {
        self.mutation
            .as_ref()
            .is_some_and(|m| m.stop.contains(&actor))
    }

    pub fn new_outputs(&self, actor: ActorId) -> &[NewOutput] {
        self.mutation
            .as_ref()
            .and_then(|m| m.add_outputs.get(&actor))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }
}
