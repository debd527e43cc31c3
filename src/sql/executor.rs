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

use crate::error::{Error, ErrorKind, Result};

/// The threads batch plans run on, at most `threads_max` at once.
pub struct Executor {
    runtime: Option<tokio::runtime::Runtime>,
    permits: Arc<Semaphore>,
    threads_max: usize,
}

impl Executor {
    /// An executor of at most `threads_max` plans at once; its runtime's workers (for the tasks
    /// operators spawn) are as many as the cores.
    pub fn start(threads_max: usize) -> std::io::Result<Executor> {
        let runtime = crate::cores_runtime("weir-query")?;
        Ok(Executor {
            runtime: Some(runtime),
            permits: Arc::new(Semaphore::new(threads_max)),
            threads_max,
        })
    }

    /// How many plans are running now.
    pub fn running(&self) -> usize {
        self.threads_max - self.permits.available_permits()
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
    /// running (open cursors included).
    pub async fn execute(
        &self,
        ctx: SessionContext,
        plan: LogicalPlan,
    ) -> Result<SendableRecordBatchStream> {
        let permit = self.permits.clone().try_acquire_owned().map_err(|_| {
            Error::new(
                ErrorKind::InsufficientResources,
                format!(
                    "too many statements are running: {} at once is the most",
                    self.threads_max
                ),
            )
            .with_hint("Close cursors that are no longer read, or retry when others have ended.")
        })?;
        let (planned_tx, planned) = oneshot::channel();
        let (tx, rx) = mpsc::channel::<DfResult<RecordBatch>>(1);
        let handle = self.handle();
        let failures = tx.clone();
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
            loop {
                let batch = tokio::select! {
                    biased;
                    _ = tx.closed() => return,
                    batch = stream.next() => batch,
                };
                let Some(batch) = batch else { return };
                let failed = batch.is_err();
                if tx.send(batch).await.is_err() || failed {
                    return;
                }
            }
        };
        std::thread::Builder::new()
            .name("weir-statement".into())
            .stack_size(crate::STACK_BYTES)
            .spawn(move || {
                let _permit = permit;
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

/// A statement's share of the query memory pool (`statement_mem`): what its operators and
/// sized functions reserve is reserved from the pool every statement shares, and refused
/// (53200, or a spill where the operator can) once the statement holds `share` bytes.
#[derive(Debug)]
struct StatementPool {
    shared: Arc<dyn MemoryPool>,
    share: usize,
    held: AtomicUsize,
}

impl std::fmt::Display for StatementPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a statement's share of {} bytes", self.share)
    }
}

impl MemoryPool for StatementPool {
    fn name(&self) -> &str {
        "statement"
    }

    fn register(&self, consumer: &MemoryConsumer) {
        self.shared.register(consumer)
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.shared.unregister(consumer)
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.shared.grow(reservation, additional);
        self.held.fetch_add(additional, Ordering::Relaxed);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.shared.shrink(reservation, shrink);
        self.held.fetch_sub(shrink, Ordering::Relaxed);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DfResult<()> {
        let held = self.held.load(Ordering::Relaxed);
        if held.saturating_add(additional) > self.share {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "the statement would hold {} bytes of working memory, over its statement_mem \
                 of {} bytes",
                held.saturating_add(additional),
                self.share
            )));
        }
        self.shared.try_grow(reservation, additional)?;
        self.held.fetch_add(additional, Ordering::Relaxed);
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.share)
    }
}

/// What one statement runs in: `shared`'s spill directory and caches, and its memory pool
/// with a share of `share` bytes of it for this statement (none of its own when `None`).
pub fn statement_runtime(shared: &Arc<RuntimeEnv>, share: Option<usize>) -> Arc<RuntimeEnv> {
    let Some(share) = share else {
        return shared.clone();
    };
    Arc::new(RuntimeEnv {
        memory_pool: Arc::new(StatementPool {
            shared: shared.memory_pool.clone(),
            share,
            held: AtomicUsize::new(0),
        }),
        disk_manager: shared.disk_manager.clone(),
        cache_manager: shared.cache_manager.clone(),
        object_store_registry: shared.object_store_registry.clone(),
    })
}
