//! Lists and gets: served from the cache, waited for, or sent to storage.
//!
//! Kubernetes counterparts: `Cacher.Get` and `Cacher.GetList` with `shouldDelegateList` in
//! `cacher.go` (v1.30, spec §4.1–4.2), 1.31's consistent reads and limit from the cache (§4.3),
//! and 1.33–1.34's `CacheDelegator` in `delegator.go` (`ShouldDelegateList`,
//! `ShouldDelegateExactRV`, `ShouldDelegateContinue`, the fallbacks; §4.4).

use alloc::boxed::Box;
use alloc::vec::Vec;

use crate::cacher::{Cacher, Parked, Phase};
use crate::continue_token;
use crate::key::{Key, KeyRange};
use crate::output::{CachedRead, Output, RangeOutcome, RangeRead, ReadOutcome, RequestId};
use crate::ready::ReadyState;
use crate::request::{GetRequest, ListRequest, RangeRequest, RvMatch};
use crate::rv::RvParam;
use crate::status::Status;
use crate::store::{list_tree, Query};
use crate::time::Timestamp;

/// How a list the cache will serve is read.
#[derive(Clone, Debug)]
pub(crate) struct ListPlan {
    /// The keys (recursive lists get a trailing `/` in 1.31+).
    pub range: KeyRange,
    /// Wait until the cache RV is at least this.
    pub min_rv: u64,
    /// Read exactly at this RV, from a snapshot.
    pub exact: Option<u64>,
    /// A consistent read: first ask storage for its current revision.
    pub consistent: bool,
    /// 0 = no limit.
    pub limit: usize,
    /// Continue from this key.
    pub start_key: Option<Vec<u8>>,
    /// The key continue tokens are made relative to: the list's key as the request gave it
    /// (`PrepareContinueToken(lastKey, key, ...)`, so `/pods/ns` gives `/b\0`, `/pods/ns/`
    /// gives `b\0`); tokens are read back under the key with its `/`.
    pub token_prefix: Vec<u8>,
    pub reason: &'static str,
    /// An etcd `Range` (answered as [`Output::Range`], falling back to storage on timeout).
    pub etcd: bool,
}

enum Decision {
    Storage(&'static str),
    Cache(ListPlan),
}

impl Cacher {
    /// Starts a list. Returns its id at once, or a 400 for malformed options; the result
    /// (served from the cache, or sent to storage, or an error) comes as an output.
    pub fn list(&mut self, now: Timestamp, req: ListRequest) -> Result<RequestId, Status> {
        self.advance(now);
        req.validate()?;
        let decision = if self.cfg.profile.is_v1_34() {
            self.decide_list_v134(&req)?
        } else {
            self.decide_list_v130(&req)
        };
        let id = self.alloc_id();
        let plan = match decision {
            Decision::Storage(reason) => {
                self.delegate_list(id, reason);
                return Ok(id);
            }
            Decision::Cache(plan) => plan,
        };
        let deadline = now.add_ms(self.cfg.request_timeout_ms);
        let key_checked = |c: &mut Cacher, req: &ListRequest| -> bool {
            // v1.37: `Cacher.GetList` checks the key before anything else it does.
            match c.cfg.profile.is_v1_37().then(|| c.check_key(&req.range)) {
                Some(Err(status)) => {
                    c.outputs.push_back(Output::Rejected { request: id, status });
                    false
                }
                _ => true,
            }
        };
        if self.cfg.resilient_initialization {
            if !self.ready.is_ready() {
                if req.selector.is_empty() && req.limit > 0 {
                    self.delegate_list(
                        id,
                        "cache not ready; a paginated list without selectors goes to storage",
                    );
                } else if key_checked(self, &req) {
                    let status = self.not_ready_429(now);
                    self.outputs.push_back(Output::Rejected { request: id, status });
                }
                return Ok(id);
            }
        } else {
            match self.ready.state() {
                ReadyState::Ready => {}
                ReadyState::Stopped => {
                    self.outputs
                        .push_back(Output::Rejected { request: id, status: Status::stopped() });
                    return Ok(id);
                }
                ReadyState::Pending => {
                    self.park(
                        id,
                        Parked::List { req: Box::new(req), plan, phase: Phase::Ready, deadline },
                    );
                    return Ok(id);
                }
            }
        }
        if !key_checked(self, &req) {
            return Ok(id);
        }
        self.list_after_ready(id, Box::new(req), plan, deadline);
        Ok(id)
    }

    /// Starts a get of one key (Kubernetes `Get`; it has no Exact semantics).
    pub fn get(&mut self, now: Timestamp, req: GetRequest) -> Result<RequestId, Status> {
        self.advance(now);
        if req.key.as_bytes().is_empty() {
            return Err(Status::bad_request("key: Required value"));
        }
        let id = self.alloc_id();
        if req.rv.is_unset() {
            self.delegate_get(id, "resourceVersion \"\" reads the latest state from storage");
            return Ok(id);
        }
        let deadline = now.add_ms(self.cfg.request_timeout_ms);
        if self.cfg.resilient_initialization {
            if !self.ready.is_ready() {
                self.delegate_get(id, "cache not ready; gets go to storage");
                return Ok(id);
            }
            if self.cfg.profile.is_v1_37() {
                let range = KeyRange::Exact(req.key.clone());
                if let Err(status) = self.check_key(&range) {
                    self.outputs.push_back(Output::Rejected { request: id, status });
                    return Ok(id);
                }
            }
        } else {
            match self.ready.state() {
                ReadyState::Ready => {}
                _ if req.rv == RvParam::Zero => {
                    self.delegate_get(id, "cache not ready; resourceVersion 0 goes to storage");
                    return Ok(id);
                }
                ReadyState::Stopped => {
                    self.outputs
                        .push_back(Output::Rejected { request: id, status: Status::stopped() });
                    return Ok(id);
                }
                ReadyState::Pending => {
                    self.park(id, Parked::Get { req, phase: Phase::Ready, deadline });
                    return Ok(id);
                }
            }
        }
        self.get_after_ready(id, req, deadline);
        Ok(id)
    }

    /// Starts an etcd `Range` over the cache with etcd's semantics: `revision` 0 reads the
    /// latest state (serializable), `linearizable` first catches up with storage's current
    /// revision, a past `revision` reads the snapshot of that revision. The result is an
    /// [`Output::Range`]: the objects (at most `limit`, 0 = all), the count of all keys in the
    /// range, and whether more remain; or a decision to ask storage (not ready, a revision the
    /// snapshots do not hold or a future one, or a linearizable read that timed out).
    pub fn range(&mut self, now: Timestamp, req: RangeRequest) -> Result<RequestId, Status> {
        self.advance(now);
        let id = self.alloc_id();
        let storage = |c: &mut Cacher, reason: &'static str| {
            c.metrics.lists_delegated += 1;
            c.outputs.push_back(Output::Range {
                request: id,
                outcome: RangeOutcome::Storage { reason },
            });
        };
        if !self.ready.is_ready() {
            storage(self, "cache not ready; served by storage");
            return Ok(id);
        }
        let mut plan = ListPlan {
            range: req.range.clone(),
            min_rv: 0,
            exact: None,
            consistent: false,
            limit: usize::try_from(req.limit).unwrap_or(usize::MAX),
            start_key: None,
            token_prefix: Vec::new(),
            reason: "serializable read served from the cache",
            etcd: true,
        };
        if req.revision > 0 {
            if req.revision > self.rv {
                storage(self, "a revision the cache has not reached yet; served by storage");
                return Ok(id);
            }
            if self.store.snapshot_at(req.revision).is_none() || req.revision < self.compacted_rv {
                storage(self, "a revision outside the cache's snapshots; served by storage");
                return Ok(id);
            }
            plan.exact = Some(req.revision);
            plan.reason = "read at a past revision, served from its snapshot";
        } else if req.linearizable {
            if !self.cfg.storage_supports_progress {
                storage(self, "linearizable reads need progress requests; served by storage");
                return Ok(id);
            }
            plan.consistent = true;
            plan.reason = "linearizable read served once the cache caught up with storage";
        }
        let deadline = now.add_ms(self.cfg.request_timeout_ms);
        let list = Box::new(ListRequest::new(req.range, RvParam::Unset));
        self.list_after_ready(id, list, plan, deadline);
        Ok(id)
    }

    // ----- decisions ------------------------------------------------------------------------

    /// v1.30 `shouldDelegateList` plus the not-ready rule for RV 0.
    fn decide_list_v130(&self, req: &ListRequest) -> Decision {
        if req.rv.is_unset() && !self.cfg.consistent_list_from_cache {
            return Decision::Storage(
                "resourceVersion \"\" is a consistent read, served by storage",
            );
        }
        if req.continue_token.is_some() {
            return Decision::Storage("continue tokens are served by storage");
        }
        if req.limit > 0 && req.rv != RvParam::Zero {
            return Decision::Storage(
                "a limit with a resourceVersion other than 0 is served by storage",
            );
        }
        if req.rv_match == Some(RvMatch::Exact) {
            return Decision::Storage("resourceVersionMatch=Exact is served by storage");
        }
        if req.rv.value() == 0 && !self.ready.is_ready() {
            return Decision::Storage("cache not ready; resourceVersion 0 goes to storage");
        }
        let consistent = req.rv.is_unset();
        let reason = match (req.rv, req.limit > 0) {
            (RvParam::Zero, true) => {
                "resourceVersion 0 is served from the cache; the limit is ignored"
            }
            (RvParam::Zero, false) => "resourceVersion 0 is served from the cache",
            (RvParam::Unset, _) => {
                "consistent read served from the cache once it caught up with storage"
            }
            (RvParam::At(_), _) => {
                "served from the cache once it is not older than the resourceVersion"
            }
        };
        Decision::Cache(ListPlan {
            range: req.range.clone(),
            min_rv: req.rv.value(),
            exact: None,
            consistent,
            limit: 0,
            start_key: None,
            token_prefix: Vec::new(),
            reason,
            etcd: false,
        })
    }

    /// 1.34 `ShouldDelegateList` (by resourceVersionMatch, continue, limit, consistency).
    fn decide_list_v134(&self, req: &ListRequest) -> Result<Decision, Status> {
        let (range, token_prefix) = match &req.range {
            KeyRange::Prefix(p) if !p.as_bytes().is_empty() && !p.as_bytes().ends_with(b"/") => {
                let mut with_slash = p.as_bytes().to_vec();
                with_slash.push(b'/');
                (KeyRange::Prefix(Key::new(&with_slash)), p.as_bytes().to_vec())
            }
            KeyRange::Prefix(p) => (req.range.clone(), p.as_bytes().to_vec()),
            other => (other.clone(), Vec::new()),
        };
        let recursive = !range.is_single_key();
        let consistent_supported =
            self.cfg.consistent_list_from_cache && self.cfg.storage_supports_progress;
        let limit = if req.rv == RvParam::Zero { 0 } else { req.limit as usize };
        let plan = |min_rv: u64,
                    exact: Option<u64>,
                    consistent: bool,
                    start_key: Option<Vec<u8>>,
                    reason| ListPlan {
            range: range.clone(),
            min_rv,
            exact,
            consistent,
            limit,
            start_key,
            token_prefix: token_prefix.clone(),
            reason,
            etcd: false,
        };
        let exact = |rv: u64, start_key: Option<Vec<u8>>, why: &'static str| -> Decision {
            if !recursive {
                return Decision::Storage("exact reads of a single key are served by storage");
            }
            if !self.store.snapshots_enabled() {
                return Decision::Storage(
                    "exact reads need snapshots (ListFromCacheSnapshot off); served by storage",
                );
            }
            if rv > self.rv {
                if consistent_supported {
                    return Decision::Cache(plan(rv, Some(rv), false, start_key, why));
                }
                return Decision::Storage(
                    "a future exact resourceVersion needs consistent reads; served by storage",
                );
            }
            if self.store.snapshot_at(rv).is_some() {
                Decision::Cache(plan(rv, Some(rv), false, start_key, why))
            } else {
                Decision::Storage(
                    "no snapshot at or before the requested resourceVersion; served by storage",
                )
            }
        };
        Ok(match req.rv_match {
            Some(RvMatch::Exact) => {
                exact(req.rv.value(), None, "exact resourceVersion served from a snapshot")
            }
            Some(RvMatch::NotOlderThan) => Decision::Cache(plan(
                req.rv.value(),
                None,
                false,
                None,
                "NotOlderThan is served from the cache once it is fresh enough",
            )),
            None => {
                if let Some(tok) = &req.continue_token {
                    if !recursive || !self.store.snapshots_enabled() {
                        return Ok(Decision::Storage(
                            "continue tokens for a single key or without snapshots are served by storage",
                        ));
                    }
                    let t = continue_token::decode(tok, range.start()).map_err(|e| {
                        Status::bad_request(alloc::format!("invalid continue token: {}", e.message))
                    })?;
                    if t.rv > 0 {
                        exact(
                            t.rv as u64,
                            Some(t.start_key),
                            "continue token served from a snapshot at its resourceVersion",
                        )
                    } else if consistent_supported {
                        Decision::Cache(plan(
                            0,
                            None,
                            true,
                            Some(t.start_key),
                            "inconsistent continuation served as a consistent read",
                        ))
                    } else {
                        Decision::Storage(
                            "inconsistent continuation needs consistent reads; served by storage",
                        )
                    }
                } else if req.limit > 0 && matches!(req.rv, RvParam::At(_)) {
                    exact(
                        req.rv.value(),
                        None,
                        "a limit with resourceVersion N is an exact read, served from a snapshot",
                    )
                } else if req.rv.is_unset() {
                    if consistent_supported {
                        Decision::Cache(plan(
                            0,
                            None,
                            true,
                            None,
                            "consistent read served from the cache once it caught up with storage",
                        ))
                    } else if !self.cfg.consistent_list_from_cache {
                        Decision::Storage("consistent reads from the cache are off (ConsistentListFromCache); served by storage")
                    } else {
                        Decision::Storage("storage does not support progress requests, so consistent reads go to storage")
                    }
                } else if req.rv == RvParam::Zero {
                    Decision::Cache(plan(
                        0,
                        None,
                        false,
                        None,
                        if req.limit > 0 {
                            "resourceVersion 0 is served from the cache; the limit is ignored"
                        } else {
                            "resourceVersion 0 is served from the cache"
                        },
                    ))
                } else {
                    Decision::Cache(plan(
                        req.rv.value(),
                        None,
                        false,
                        None,
                        "served from the cache once it is not older than the resourceVersion",
                    ))
                }
            }
        })
    }

    // ----- the list path ----------------------------------------------------------------------

    pub(crate) fn list_after_ready(
        &mut self,
        id: RequestId,
        req: Box<ListRequest>,
        plan: ListPlan,
        deadline: Timestamp,
    ) {
        if plan.consistent {
            self.park(id, Parked::List { req, plan, phase: Phase::CurrentRv, deadline });
            self.outputs.push_back(Output::NeedCurrentRevision { request: id });
            return;
        }
        self.list_wait_fresh(id, req, plan, deadline);
    }

    pub(crate) fn list_wait_fresh(
        &mut self,
        id: RequestId,
        req: Box<ListRequest>,
        plan: ListPlan,
        deadline: Timestamp,
    ) {
        if plan.min_rv > self.rv {
            let progress = self.progress_while_waiting(false);
            let fresh_deadline = self.now.add_ms(self.cfg.freshness_timeout_ms);
            self.park(
                id,
                Parked::List {
                    req,
                    plan: plan.clone(),
                    phase: Phase::Fresh {
                        rv: plan.min_rv,
                        deadline: fresh_deadline,
                        progress,
                        started: self.now,
                    },
                    deadline,
                },
            );
            return;
        }
        self.serve_list(id, &req, plan, 0);
    }

    pub(crate) fn serve_list(
        &mut self,
        id: RequestId,
        req: &ListRequest,
        plan: ListPlan,
        waited_ms: u64,
    ) {
        if plan.min_rv > 0 {
            self.metrics.observe_read_wait(waited_ms);
        }
        let q = Query {
            range: &plan.range,
            start: plan.start_key.as_deref(),
            selector: &req.selector,
            limit: plan.limit,
            count_remaining: true,
        };
        let (page, rv) = match plan.exact {
            Some(rv) => match self.store.snapshot_at(rv) {
                Some(tree) => (list_tree(tree, &q), rv),
                None => {
                    // 1.34: a 410 from the snapshots falls back to storage.
                    self.delegate_list(
                        id,
                        "the snapshot was dropped before the read; served by storage",
                    );
                    return;
                }
            },
            None => (self.store.list(&q), self.rv),
        };
        let index = page.index.as_deref().unwrap_or("");
        self.metrics.count_cache_list(index, page.scanned, page.items.len());
        if plan.etcd {
            let tree = match plan.exact {
                Some(rv) => self.store.snapshot_at(rv),
                None => Some(self.store.tree()),
            };
            let count = tree.map_or(0, |t| count_in(t, &plan.range));
            let more = page.items.len() < count;
            self.outputs.push_back(Output::Range {
                request: id,
                outcome: RangeOutcome::Cache(RangeRead {
                    header_rv: self.rv,
                    items: page.items,
                    count: count as u64,
                    more,
                    reason: plan.reason,
                }),
            });
            return;
        }
        if plan.consistent {
            self.metrics.consistent_reads_ok += 1;
        }
        let continue_token = page
            .continue_key
            .as_deref()
            .and_then(|k| continue_token::encode(k, &plan.token_prefix, rv));
        let remaining = if continue_token.is_some() { page.remaining } else { None };
        self.outputs.push_back(Output::List {
            request: id,
            outcome: ReadOutcome::Cache(CachedRead {
                rv,
                items: page.items,
                continue_token,
                remaining,
                reason: plan.reason,
            }),
        });
    }

    pub(crate) fn delegate_list(&mut self, id: RequestId, reason: &'static str) {
        self.metrics.lists_delegated += 1;
        self.outputs
            .push_back(Output::List { request: id, outcome: ReadOutcome::Storage { reason } });
    }

    // ----- the get path -----------------------------------------------------------------------

    pub(crate) fn get_after_ready(&mut self, id: RequestId, req: GetRequest, deadline: Timestamp) {
        let need = req.rv.value();
        if need > self.rv {
            let progress = self.progress_while_waiting(false);
            let fresh_deadline = self.now.add_ms(self.cfg.freshness_timeout_ms);
            self.park(
                id,
                Parked::Get {
                    req,
                    phase: Phase::Fresh {
                        rv: need,
                        deadline: fresh_deadline,
                        progress,
                        started: self.now,
                    },
                    deadline,
                },
            );
            return;
        }
        self.serve_get(id, &req, 0);
    }

    pub(crate) fn serve_get(&mut self, id: RequestId, req: &GetRequest, waited_ms: u64) {
        if req.rv.value() > 0 {
            self.metrics.observe_read_wait(waited_ms);
        }
        match self.store.get(req.key.as_bytes()) {
            Some(o) => {
                let items = alloc::vec![o.clone()];
                self.outputs.push_back(Output::Get {
                    request: id,
                    outcome: ReadOutcome::Cache(CachedRead {
                        rv: self.rv,
                        items,
                        continue_token: None,
                        remaining: None,
                        reason: if req.rv == RvParam::Zero {
                            "resourceVersion 0 is served from the cache"
                        } else {
                            "served from the cache once it is not older than the resourceVersion"
                        },
                    }),
                });
            }
            None => {
                let status = self.not_found(req.key.as_bytes());
                self.outputs.push_back(Output::Rejected { request: id, status });
            }
        }
    }

    /// The registry's 404 for a key (`InterpretGetError`: `pods "zzz" not found`), the
    /// resource named after the resource prefix when there is one.
    fn not_found(&self, key: &[u8]) -> Status {
        match self.cfg.resource_prefix.as_deref() {
            Some(prefix) => {
                let resource = prefix.trim_end_matches('/').rsplit('/').next().unwrap_or("");
                let key = crate::key::display_key(key);
                Status::not_found_in(resource, key.rsplit('/').next().unwrap_or(""))
            }
            None => Status::not_found(key),
        }
    }

    fn delegate_get(&mut self, id: RequestId, reason: &'static str) {
        self.metrics.gets_delegated += 1;
        self.outputs
            .push_back(Output::Get { request: id, outcome: ReadOutcome::Storage { reason } });
    }
}

/// Keys of `range` in `tree`, counted from subtree sizes.
fn count_in(tree: &crate::btree::Tree, range: &KeyRange) -> usize {
    range.intervals().iter().map(|(lo, hi)| tree.count_range(lo, hi.as_deref())).sum()
}
