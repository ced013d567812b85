//! The worker's cache of its kinds' policies: their retry policies (`artex kind retry`,
//! `crate::retry`; a kind without one retries after the worker's own backoff) and which
//! of them are fair (`artex kind limit K --fair`: its local queue takes their tasks by
//! turns, `super::turns`). Read at start, and again every
//! [`POLICY_REFRESH`](super::POLICY_REFRESH) while it holds tasks.

use std::collections::HashMap;
use std::time::Instant;

use actix::prelude::*;

use super::{Worker, WorkerConfig, POLICY_REFRESH};
use crate::blackboard::KindPolicies;
use crate::flight::SingleFlight;
use crate::retry::RetryPolicy;

/// Its kinds' retry policies as last read.
#[derive(Debug, Default)]
pub(super) struct Policies {
    pub map: HashMap<String, RetryPolicy>,
    /// When they were last read; `None`: never.
    pub read_at: Option<Instant>,
    /// A read is in flight.
    pub flight: SingleFlight,
}

impl Policies {
    /// The wait before the retry of a failed attempt of `kind` after `retries` earlier
    /// failures: its kind's retry policy as last read, else the fleet's default.
    pub fn backoff_ms(&self, config: &WorkerConfig, kind: &str, retries: i32) -> i64 {
        match self.map.get(kind) {
            Some(p) => p.delay_ms(retries),
            None => config.backoff_ms(retries),
        }
    }

    /// Whether they are due to be read again.
    pub fn due(&self) -> bool {
        self.read_at.is_none_or(|at| at.elapsed() >= POLICY_REFRESH)
    }
}

impl Worker {
    /// The wait before the retry of a failed attempt of `kind` (see
    /// [`Policies::backoff_ms`]).
    pub(super) fn backoff_ms(&self, kind: &str, retries: i32) -> i64 {
        self.policies.backoff_ms(&self.config, kind, retries)
    }

    /// Starts with `policies`, read before the worker takes its first task (see
    /// `artex::runtime::run_worker`): a task that fails at once already waits as its
    /// kind's policy says, not as the worker's own backoff, and a fair kind's first
    /// tasks already take turns.
    pub fn with_kind_policies(mut self, policies: KindPolicies) -> Self {
        self.apply_policies(policies);
        self
    }

    fn apply_policies(&mut self, policies: KindPolicies) {
        self.policies.map = policies.retry;
        self.held.turns.set_fair(&policies.fair);
        self.policies.read_at = Some(Instant::now());
    }

    /// Reads its kinds' policies again. A failed read keeps the last ones (and is
    /// tried again at the next tick).
    pub(super) fn read_policies(&mut self, ctx: &mut Context<Self>) {
        if !self.policies.flight.try_start() {
            return;
        }
        let bb = self.bb.clone();
        let kinds = self.registry.kinds();
        async move { bb.kind_policies(&kinds).await }
            .into_actor(self)
            .map(|res, act, _ctx| {
                act.policies.flight.end();
                match res {
                    Ok(policies) => act.apply_policies(policies),
                    Err(e) => tracing::debug!(error = %e, "cannot read the kinds' policies"),
                }
            })
            .spawn(ctx);
    }
}
