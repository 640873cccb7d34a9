//! Requests that wait: for the ready gate, for storage's current revision, or until the cache
//! is fresh enough; and the progress requests that hurry freshness along.
//!
//! Kubernetes counterparts: `ready.go`'s `wait` as `Cacher.Watch/Get/GetList` use it,
//! `watch_cache.go`'s `waitUntilFreshAndBlock` (3 s, then "Too large resource version"), and
//! `watch_progress.go`'s `conditionalProgressRequester` (a progress request every 100 ms while
//! anyone waits). Here a waiting request is parked under its id and resumed by the event that
//! ends its wait.

use alloc::vec::Vec;

use crate::cacher::{Cacher, Parked, Phase, TimerReason};
use crate::output::{CloseCause, Output, RequestId};
use crate::status::{Reason, Status};
use crate::time::Timestamp;

impl Cacher {
    /// Parks a request in its phase, with the phase's timer.
    pub(crate) fn park(&mut self, id: RequestId, parked: Parked) {
        match parked.phase() {
            Phase::Ready | Phase::CurrentRv => {
                if let Some(d) = parked_deadline(&parked) {
                    self.set_timer(d, TimerReason::RequestTimeout, id.0);
                }
            }
            Phase::Fresh { rv, deadline, progress, .. } => {
                self.set_timer(*deadline, TimerReason::FreshnessWait, id.0);
                self.fresh_waiters.insert((*rv, id));
                if *progress {
                    self.add_progress_waiter();
                }
            }
        }
        self.parked.insert(id, parked);
    }

    /// Takes a request out of its wait, clearing its timer.
    pub(crate) fn unpark(&mut self, id: RequestId) -> Option<Parked> {
        let parked = self.parked.remove(&id)?;
        match parked.phase() {
            Phase::Ready | Phase::CurrentRv => {
                if let Some(d) = parked_deadline(&parked) {
                    self.clear_timer(d, TimerReason::RequestTimeout, id.0);
                }
            }
            Phase::Fresh { rv, deadline, progress, .. } => {
                self.clear_timer(*deadline, TimerReason::FreshnessWait, id.0);
                self.fresh_waiters.remove(&(*rv, id));
                if *progress {
                    self.remove_progress_waiter();
                }
            }
        }
        Some(parked)
    }

    /// The gate opened: requests parked for it continue, oldest first.
    pub(crate) fn resume_parked_for_ready(&mut self) {
        let ids: Vec<RequestId> = self
            .parked
            .iter()
            .filter(|(_, p)| matches!(p.phase(), Phase::Ready))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if !self.ready.is_ready() {
                break;
            }
            let Some(p) = self.unpark(id) else { continue };
            let generation = self.ready.generation();
            match p {
                Parked::Watch { req, sie, deadline, .. } => {
                    self.watch_after_ready(id, req, sie, generation, deadline)
                }
                Parked::List { req, plan, deadline, .. } => {
                    self.list_after_ready(id, req, plan, deadline)
                }
                Parked::Get { req, deadline, .. } => self.get_after_ready(id, req, deadline),
            }
        }
    }

    /// The cache RV advanced: readers waiting for at most it continue.
    pub(crate) fn wake_fresh_waiters(&mut self) {
        while let Some(&(rv, id)) = self.fresh_waiters.first() {
            if rv > self.rv {
                break;
            }
            let Some(p) = self.unpark(id) else {
                self.fresh_waiters.pop_first();
                continue;
            };
            let waited = match p.phase() {
                Phase::Fresh { started, .. } => self.now.ms_since(*started),
                _ => 0,
            };
            match p {
                Parked::Watch { req, sie, generation, required_rv, deadline, .. } => {
                    self.register_watch(id, *req, sie, generation, required_rv, deadline)
                }
                Parked::List { req, plan, .. } => self.serve_list(id, &req, plan, waited),
                Parked::Get { req, .. } => self.serve_get(id, &req, waited),
            }
        }
    }

    pub(crate) fn continue_with_current_rv(&mut self, id: RequestId, current: u64) {
        let Some(p) = self.unpark(id) else { return };
        match p {
            Parked::Watch { req, sie, generation, deadline, .. } => {
                if current == 0 {
                    // GetCurrentResourceVersionFromStorage treats 0 as an error.
                    self.error_watcher(
                        id,
                        Status::new(
                            Reason::InternalError,
                            "the current resource version must be greater than 0",
                        ),
                    );
                    return;
                }
                self.watch_after_required(id, req, sie, generation, current, deadline)
            }
            Parked::List { req, mut plan, deadline, .. } => {
                plan.min_rv = current;
                self.list_wait_fresh(id, req, plan, deadline)
            }
            Parked::Get { .. } => {}
        }
    }

    pub(crate) fn on_fresh_timeout(&mut self, id: RequestId) {
        let Some(p) = self.unpark(id) else { return };
        let (need, waited) = match p.phase() {
            Phase::Fresh { rv, started, .. } => (*rv, self.now.ms_since(*started)),
            _ => (0, 0),
        };
        let status = Status::too_large(need, self.rv);
        match p {
            Parked::Watch { .. } => self.error_watcher(id, status),
            Parked::List { plan, .. } => {
                if need > 0 {
                    self.metrics.observe_read_wait(waited);
                }
                if plan.etcd {
                    self.delegate_range(
                        id,
                        "linearizable read timed out waiting for the cache; served by storage",
                    );
                } else if plan.consistent
                    && self.cfg.profile.is_v1_34()
                    && self.cfg.consistent_list_skip_timeout_fallback
                {
                    // v1.37's ConsistentListFromCacheSkipTimeoutFallback: a retryable answer
                    // instead of the read going to storage (`delegator.go`: 429 with the
                    // timeout's message, Retry-After 1).
                    let status = Status {
                        reason: Reason::TooManyRequests,
                        message: status.message,
                        retry_after_s: Some(1),
                    };
                    self.outputs.push_back(Output::Rejected { request: id, status });
                } else if plan.consistent && self.cfg.profile.is_v1_34() {
                    // 1.31+: a consistent read that times out falls back to storage.
                    self.metrics.consistent_reads_fallback += 1;
                    self.metrics.lists_delegated += 1;
                    self.outputs.push_back(Output::List {
                        request: id,
                        outcome: crate::output::ReadOutcome::Storage {
                            reason: "consistent read timed out waiting for the cache; falling back to storage",
                        },
                    });
                } else {
                    self.outputs.push_back(Output::Rejected { request: id, status });
                }
            }
            Parked::Get { .. } => {
                if need > 0 {
                    self.metrics.observe_read_wait(waited);
                }
                self.outputs.push_back(Output::Rejected { request: id, status })
            }
        }
    }

    fn delegate_range(&mut self, id: RequestId, reason: &'static str) {
        self.metrics.consistent_reads_fallback += 1;
        self.metrics.lists_delegated += 1;
        self.outputs.push_back(Output::Range {
            request: id,
            outcome: crate::output::RangeOutcome::Storage { reason },
        });
    }

    pub(crate) fn on_request_timeout(&mut self, id: RequestId) {
        if self.unpark(id).is_some() {
            self.outputs.push_back(Output::Rejected {
                request: id,
                status: Status::new(Reason::ServiceUnavailable, "context deadline exceeded"),
            });
        }
    }

    pub(crate) fn on_watch_deadline(&mut self, id: RequestId) {
        self.close_watcher(id, CloseCause::Timeout, None, None);
    }

    /// A reader starts waiting for freshness (`waitingUntilFresh.Add`). The requester's loop
    /// (`watch_progress.go` `Run`) sleeps while nobody waits; its clock does not: in 1.30 a
    /// ticker started with the cacher, in 1.33+ a timer started with it and re-armed after each
    /// request. A tick (or fire) that came while nobody waited is taken at once, so the first
    /// request often goes out immediately; later ones follow the clock.
    fn add_progress_waiter(&mut self) {
        self.progress_waiters += 1;
        if self.progress_active {
            return;
        }
        self.progress_active = true;
        let now = self.now;
        let period = self.cfg.progress_request_interval_ms;
        let next = if self.cfg.profile.is_v1_34() {
            // `progress/watch_progress.go`: the timer fired at `progress_mark` (if that is past)
            // and nobody took it.
            if self.progress_mark <= now {
                self.request_progress();
                self.progress_mark = now.add_ms(period);
            }
            self.progress_mark
        } else {
            // `watch_progress.go`: a tick since the last one consumed waits in the channel.
            let pending = self.next_progress_tick(self.progress_mark);
            if pending <= now {
                self.progress_mark = now;
                self.request_progress();
                self.next_progress_tick(now)
            } else {
                pending
            }
        };
        self.progress_at = Some(next);
        self.set_timer(next, TimerReason::ProgressRequest, 0);
    }

    /// A reader stops waiting (`Remove`). The loop notices at its next tick.
    fn remove_progress_waiter(&mut self) {
        self.progress_waiters = self.progress_waiters.saturating_sub(1);
    }

    pub(crate) fn on_progress_timer(&mut self, now: Timestamp) {
        self.progress_at = None;
        if !self.progress_active {
            return;
        }
        let period = self.cfg.progress_request_interval_ms;
        if self.cfg.profile.is_v1_34() {
            if self.progress_waiters == 0 {
                // `timer.Reset(0)`: fired again at once, for the next waiter to take.
                self.progress_mark = now;
                self.progress_active = false;
                return;
            }
            self.progress_mark = now.add_ms(period);
            self.request_progress();
            self.progress_at = Some(self.progress_mark);
            self.set_timer(self.progress_mark, TimerReason::ProgressRequest, 0);
        } else {
            self.progress_mark = now;
            if self.progress_waiters == 0 {
                self.progress_active = false;
                return;
            }
            self.request_progress();
            let next = self.next_progress_tick(now);
            self.progress_at = Some(next);
            self.set_timer(next, TimerReason::ProgressRequest, 0);
        }
    }

    fn request_progress(&mut self) {
        self.metrics.progress_requests += 1;
        self.outputs.push_back(Output::RequestProgress);
    }

    /// The 1.30 ticker's first tick after `t`: ticks fall on `created + k·period`, k ≥ 1.
    fn next_progress_tick(&self, t: Timestamp) -> Timestamp {
        let period = self.cfg.progress_request_interval_ms;
        let k = t.ms_since(self.created) / period + 1;
        self.created.add_ms(k.saturating_mul(period))
    }
}

fn parked_deadline(p: &Parked) -> Option<Timestamp> {
    match p {
        Parked::Watch { deadline, .. } => *deadline,
        Parked::List { deadline, .. } | Parked::Get { deadline, .. } => Some(*deadline),
    }
}
