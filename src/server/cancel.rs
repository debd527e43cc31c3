//! CancelRequest: each session's process id and secret key, and the signal that stops the
//! query it is running, as PostgreSQL does. The sessions themselves (what `pg_stat_activity`
//! shows, what `pg_cancel_backend` signals) are in the registry this keeps the keys of.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use pgwire::api::cancel::CancelHandler;
use pgwire::api::{ClientInfo, PidSecretKeyGenerator, RandomPidSecretKeyGenerator};
use pgwire::messages::cancel::CancelRequest;
use pgwire::messages::startup::SecretKey;

use crate::sql::{BackendStart, Backends, Registered};

/// The sessions a CancelRequest can reach: each connection's process id, with its secret key,
/// and the registry of the sessions under those ids.
#[derive(Default)]
pub struct Cancels {
    keys: std::sync::Mutex<HashMap<i32, SecretKey>>,
    /// Numbers process ids in turn and draws each session's random key.
    generator: RandomPidSecretKeyGenerator,
    backends: Arc<Backends>,
}

impl Cancels {
    /// Registers a new session under a process id no other session has; returns its key and
    /// its place in the registry (the id is `start.pid` there), which it leaves when that is
    /// dropped.
    pub(super) fn register<C: ClientInfo>(
        &self,
        client: &C,
        start: impl FnOnce(i32) -> BackendStart,
    ) -> (SecretKey, Registered) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let (pid, key) = self.generator.generate(client);
            if let std::collections::hash_map::Entry::Vacant(slot) = keys.entry(pid) {
                slot.insert(key.clone());
                return (key, self.backends.register(start(pid)));
            }
        }
    }

    /// How many sessions the role `user` holds now.
    pub(super) fn sessions_of(&self, user: &str) -> usize {
        (self.backends.list().iter())
            .filter(|b| b.start.user == user)
            .count()
    }

    pub(super) fn remove(&self, pid: i32) {
        self.keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&pid);
    }
}

#[async_trait]
impl CancelHandler for Canceller {
    /// Stops the query the session with this process id and key is running, if any, as
    /// PostgreSQL does; a request naming no session, or with the wrong key, does nothing.
    async fn on_cancel_request(&self, request: CancelRequest) {
        let known = (self.cancels.keys.lock().unwrap_or_else(|p| p.into_inner()))
            .get(&request.pid)
            .is_some_and(|key| key.eq_value(&request.secret_key));
        if let Some(backend) = known
            .then(|| self.cancels.backends.get(request.pid))
            .flatten()
        {
            backend.cancel();
        }
    }
}

pub(super) struct Canceller {
    pub(super) cancels: Arc<Cancels>,
}
