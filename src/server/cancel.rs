//! CancelRequest: each session's process id and secret key, and the signal that stops the
//! query it is running, as PostgreSQL does.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use pgwire::api::cancel::CancelHandler;
use pgwire::api::{ClientInfo, PidSecretKeyGenerator, RandomPidSecretKeyGenerator};
use pgwire::messages::cancel::CancelRequest;
use pgwire::messages::startup::SecretKey;
use tokio::sync::Notify;

/// The sessions a CancelRequest can reach: each connection's process id, with its secret key
/// and the signal that stops its running query.
#[derive(Default)]
pub struct Cancels {
    sessions: std::sync::Mutex<HashMap<i32, (SecretKey, Arc<Notify>)>>,
    /// Numbers process ids in turn and draws each session's random key.
    keys: RandomPidSecretKeyGenerator,
}

impl Cancels {
    /// Registers a new session under a process id no other session has; returns the id, its
    /// key and the session's cancel signal.
    pub(super) fn register<C: ClientInfo>(&self, client: &C) -> (i32, SecretKey, Arc<Notify>) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let (pid, key) = self.keys.generate(client);
            if let std::collections::hash_map::Entry::Vacant(slot) = sessions.entry(pid) {
                let signal = Arc::new(Notify::new());
                slot.insert((key.clone(), signal.clone()));
                return (pid, key, signal);
            }
        }
    }

    pub(super) fn remove(&self, pid: i32) {
        self.sessions
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
        let signal = self
            .cancels
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&request.pid)
            .filter(|(key, _)| key.eq_value(&request.secret_key))
            .map(|(_, signal)| signal.clone());
        if let Some(signal) = signal {
            signal.notify_waiters();
        }
    }
}

pub(super) struct Canceller {
    pub(super) cancels: Arc<Cancels>,
}
