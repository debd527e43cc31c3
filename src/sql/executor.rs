//! Where batch plans run: each on a thread of its own, off the async workers that serve
//! sessions, the accept loop, the admin port and the barrier coordinator, and off the
//! dataflow's threads. A statement that computes for a minute in one poll (a sort's merge, a
//! function over a wide batch) then holds up only itself: the kernel shares the cores between
//! its thread and everything else, and `SELECT 1` from another session is answered meanwhile.
//! See `docs/design/0022-statement-resources.md`.
//!
//! A plan's thread drives it on the query runtime (`Executor::runtime`), whose blocking pool
//! reads scans' parts and whose timers and spawned tasks DataFusion's operators use. Its
//! batches reach the session through a channel of one batch, so rows a slow client has not
//! read wait in the plan, not in a queue. A dropped stream (the statement ended, was
//! cancelled or timed out, or its client left) ends the plan at its next batch or its next
//! wait, and frees its memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::{
    MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
};
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::prelude::SessionContext;
use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::{Settings, Usage};
use crate::error::{Error, ErrorKind, Result};

/// The threads batch plans run on, at most `threads_max` at once, the last `reserved` of them
/// for superusers' statements.
pub struct Executor {
    runtime: Option<tokio::runtime::Runtime>,
    permits: Arc<Semaphore>,
    reserve: Arc<Semaphore>,
    threads_max: usize,
    reserved: usize,
}

impl Executor {
    /// An executor of at most `threads_max` plans at once, of which `reserved` are for
    /// superusers alone (so that one can always run `pg_cancel_backend` and look around); its
    /// runtime's workers (for the tasks operators spawn) are as many as the cores.
    pub fn start(threads_max: usize, reserved: usize) -> std::io::Result<Executor> {
        let runtime = crate::cores_runtime("weir-query")?;
        let reserved = reserved.min(threads_max.saturating_sub(1));
        Ok(Executor {
            runtime: Some(runtime),
            permits: Arc::new(Semaphore::new(threads_max - reserved)),
            reserve: Arc::new(Semaphore::new(reserved)),
            threads_max,
            reserved,
        })
    }

    /// How many plans are running now.
    pub fn running(&self) -> usize {
        self.threads_max - self.permits.available_permits() - self.reserve.available_permits()
    }

    /// A place for one more plan of `owner`'s: refused with 53000 past the limit (for others
    /// than superusers, past the limit less the reserve).
    fn permit(&self, owner: Option<&Owner>) -> Result<tokio::sync::OwnedSemaphorePermit> {
        let superuser = owner.is_none_or(|o| o.superuser);
        let permit = match self.permits.clone().try_acquire_owned() {
            Err(_) if superuser => self.reserve.clone().try_acquire_owned(),
            p => p,
        };
        permit.map_err(|_| {
            let most = self.threads_max;
            let message = match self.reserved {
                r if r > 0 && !superuser => format!(
                    "too many statements are running: {most} at once is the most, {r} of them \
                     kept for superusers"
                ),
                _ => format!("too many statements are running: {most} at once is the most"),
            };
            Error::new(ErrorKind::InsufficientResources, message).with_hint(
                "Close cursors that are no longer read, or retry when others have ended.",
            )
        })
    }

    fn handle(&self) -> tokio::runtime::Handle {
        self.runtime
            .as_ref()
            .expect("the query runtime runs until dropped")
            .handle()
            .clone()
    }

    /// Plans `plan` physically and runs it on a thread of its own; the stream returned gives
    /// its batches as they are computed. Refused with 53000 when `threads_max` plans are
    /// running (open cursors included). The thread's CPU time counts as the session's that
    /// owns `ctx` ([`own_statement`]).
    pub async fn execute(
        &self,
        ctx: SessionContext,
        plan: LogicalPlan,
    ) -> Result<SendableRecordBatchStream> {
        let owner = ctx.state_ref().read().config().get_extension::<Owner>();
        let permit = self.permit(owner.as_deref())?;
        let (planned_tx, planned) = oneshot::channel();
        let (tx, rx) = mpsc::channel::<DfResult<RecordBatch>>(1);
        let handle = self.handle();
        let failures = tx.clone();
        let pool = ctx.runtime_env().memory_pool.clone();
        let job = async move {
            let mut stream = match physical(&ctx, plan).await {
                Ok(s) => s,
                Err(e) => {
                    let _ = planned_tx.send(Err(e));
                    return;
                }
            };
            if planned_tx.send(Ok(stream.schema())).is_err() {
                return;
            }
            let last = loop {
                let batch = tokio::select! {
                    biased;
                    _ = tx.closed() => return,
                    batch = stream.next() => batch,
                };
                match batch {
                    Some(Ok(batch)) => {
                        if tx.send(Ok(batch)).await.is_err() {
                            return;
                        }
                    }
                    other => break other,
                }
            };
            // The statement ends (its rows or its error reach the client) only once its
            // operators have given back their memory, so that the session's next statement
            // finds it free.
            drop(stream);
            given_back(pool.as_ref()).await;
            if let Some(failed) = last {
                let _ = tx.send(failed).await;
            }
        };
        std::thread::Builder::new()
            .name("weir-statement".into())
            .stack_size(crate::STACK_BYTES)
            .spawn(move || {
                let _permit = permit;
                let _counted = owner.map(|o| o.usage.count_this_thread());
                // A panic in an operator fails the statement, which must not look like an end
                // of its rows; the server goes on.
                let ended = handle.block_on(std::panic::AssertUnwindSafe(job).catch_unwind());
                if ended.is_err() {
                    let e = DataFusionError::Execution("a statement's plan panicked".into());
                    let _ = failures.blocking_send(Err(e));
                }
            })
            .map_err(|e| {
                Error::new(
                    ErrorKind::InsufficientResources,
                    format!("could not start a statement's thread: {e}"),
                )
            })?;
        let schema = planned
            .await
            .map_err(|_| Error::internal("a statement's thread ended before its plan"))??;
        let rows = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|batch| (batch, rx))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, rows)))
    }
}

/// The most a statement waits for its operators to give back their memory once its plan has
/// ended: tasks its operators spawned drop their state on the query runtime's workers, just
/// after their last rows are sent.
const GIVE_BACK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Waits until a statement's own pool (`StatementPool`) holds nothing, up to `GIVE_BACK_WAIT`.
/// The shared pool, which other statements use too, is not waited for.
async fn given_back(pool: &dyn MemoryPool) {
    if pool.name() != StatementPool::NAME {
        return;
    }
    let emptied = async {
        while pool.reserved() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    };
    let _ = tokio::time::timeout(GIVE_BACK_WAIT, emptied).await;
}

/// `plan` analyzed, its functions that size their results bounded by the query memory pool
/// (`sized::bound_functions`: before the optimizer, which would compute their constant calls
/// outside the pool), optimized, planned physically and started.
async fn physical(ctx: &SessionContext, plan: LogicalPlan) -> DfResult<SendableRecordBatchStream> {
    let state = ctx.state();
    let plan = match plan {
        LogicalPlan::Explain(_) => state.optimize(&plan)?,
        plan => {
            let config = state.config_options().clone();
            let plan = state
                .analyzer()
                .execute_and_check(plan, &config, |_, _| {})?;
            let plan = super::sized::bound_functions(plan, &state.runtime_env().memory_pool)?;
            state.optimizer().optimize(plan, &state, |_, _| {})?
        }
    };
    let physical = state
        .query_planner()
        .create_physical_plan(&plan, &state)
        .await?;
    datafusion::physical_plan::execute_stream(physical, ctx.task_ctx())
}

impl Drop for Executor {
    /// Stops the query runtime (plans still running end at their next wait).
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            crate::stop_runtime(runtime, STOP_WAIT, "the query runtime");
        }
    }
}

/// How long a dropped executor waits for plans' tasks.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A statement's place in the query memory pool: what its operators and sized functions
/// reserve is reserved from the pool every statement shares, counted as its session's, and
/// refused (53200, or a spill where the operator can) once the statement holds its share
/// (`statement_mem`), if it has one.
#[derive(Debug)]
struct StatementPool {
    shared: Arc<dyn MemoryPool>,
    share: Option<usize>,
    held: AtomicUsize,
    usage: Option<Arc<Usage>>,
}

impl std::fmt::Display for StatementPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.share {
            Some(share) => write!(f, "a statement's share of {share} bytes"),
            None => write!(f, "a statement's place in {}", self.shared.name()),
        }
    }
}

impl StatementPool {
    const NAME: &'static str = "statement";

    fn add(&self, bytes: usize) {
        self.held.fetch_add(bytes, Ordering::Relaxed);
        if let Some(usage) = &self.usage {
            usage.grow(bytes);
        }
    }
}

impl MemoryPool for StatementPool {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.shared.register(consumer)
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.shared.unregister(consumer)
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.shared.grow(reservation, additional);
        self.add(additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.shared.shrink(reservation, shrink);
        self.held.fetch_sub(shrink, Ordering::Relaxed);
        if let Some(usage) = &self.usage {
            usage.shrink(shrink);
        }
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DfResult<()> {
        let held = self.held.load(Ordering::Relaxed);
        if let Some(share) = self.share.filter(|s| held.saturating_add(additional) > *s) {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "the statement would hold {} bytes of working memory, over its statement_mem \
                 of {share} bytes",
                held.saturating_add(additional),
            )));
        }
        self.shared.try_grow(reservation, additional)?;
        self.add(additional);
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    fn memory_limit(&self) -> MemoryLimit {
        match self.share {
            Some(share) => MemoryLimit::Finite(share),
            None => self.shared.memory_limit(),
        }
    }
}

/// What one statement of a session with `settings` runs in: `shared`'s spill directory and
/// caches, and its memory pool, where the statement's reservations count as the session's and
/// are bounded by its `statement_mem` too.
pub fn statement_runtime(shared: &Arc<RuntimeEnv>, settings: &Settings) -> Result<Arc<RuntimeEnv>> {
    let share = settings.statement_mem()?;
    let usage = settings.backend.as_ref().map(|b| b.usage.clone());
    if share.is_none() && usage.is_none() {
        return Ok(shared.clone());
    }
    Ok(Arc::new(RuntimeEnv {
        memory_pool: Arc::new(StatementPool {
            shared: shared.memory_pool.clone(),
            share,
            held: AtomicUsize::new(0),
            usage,
        }),
        disk_manager: shared.disk_manager.clone(),
        cache_manager: shared.cache_manager.clone(),
        object_store_registry: shared.object_store_registry.clone(),
    }))
}

/// Whose a statement is: the session whose memory and CPU time it counts in, and whether it may
/// take the plans kept for superusers.
#[derive(Debug)]
struct Owner {
    usage: Arc<Usage>,
    superuser: bool,
}

/// Marks `ctx` as a statement of the session with `settings`, for [`Executor::execute`].
pub fn own_statement(ctx: &SessionContext, settings: &Settings) {
    let Some(backend) = &settings.backend else {
        return;
    };
    let owner = Owner {
        usage: backend.usage.clone(),
        superuser: settings.get("is_superuser").is_none_or(|v| v == "on"),
    };
    ctx.state_ref()
        .write()
        .config_mut()
        .set_extension(Arc::new(owner));
}
