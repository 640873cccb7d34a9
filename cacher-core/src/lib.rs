//! # cacher-core: the Kubernetes watch cache as a sans-IO state machine
//!
//! This crate is kube-apiserver's watch cache (`k8s.io/apiserver/pkg/storage/cacher`, v1.30.3,
//! with the later versions' changes behind a [`Profile`]) rebuilt as pure state transitions: no
//! clock, no threads, no I/O, no unseeded randomness. A host feeds it what storage says and what
//! clients ask, passes the time in, and carries out what it asks for.
//!
//! One module per concept, each naming its Kubernetes counterpart:
//!
//! | module | Kubernetes |
//! |---|---|
//! | `ring` | the cyclic buffer of `watch_cache.go` |
//! | `interval` | `watch_cache_interval.go` |
//! | `store`, `btree` | `store_btree.go`, the snapshots of 1.33+ |
//! | `ready` | `ready.go` |
//! | `budget` | `time_budget.go` |
//! | `watcher` | `cache_watcher.go` |
//! | `dispatch` | `cacher.go`'s dispatch loop |
//! | `bookmarks` | `cacher.go`'s bookmark time buckets |
//! | `waits` | `waitUntilFreshAndBlock`, `watch_progress.go` |
//! | `watch`, `reads` | `Cacher.Watch`, `Cacher.Get/GetList`, `delegator.go` |
//! | `selector` | apimachinery's `labels` and `fields` selectors |
//! | `continue_token` | `storage/continue.go` |
//! | `replay` | the scenario replayer, and the driver, request specs, output items and config/metrics lists that the Python and JS bindings share with it (feature `serde`) |
//! | `simulate` | a client-go-driven cacher: hours of writes, watchers, disconnects, compactions and restarts, run against the real [`Cacher`] (its JSON form with feature `serde`) |
//!
//! ## The run loop
//!
//! Drain [`Cacher::poll_output`] after every call that changes the core; sleep until
//! [`Cacher::poll_timeout`] and call [`Cacher::handle_timeout`]:
//!
//! ```
//! use cacher_core::{Cacher, Config, Key, KeyRange, Object, Output, RvParam, Timestamp, WatchRequest};
//!
//! let mut now = Timestamp::from_millis(0);
//! let mut cacher = Cacher::new(Config::default(), now).unwrap();
//!
//! // The host listed storage at revision 9 and hands the result over.
//! cacher.handle_replace(now, 9, vec![Object::new(b"/pods/ns/a", Some(b"v1"), 5)]).unwrap();
//!
//! // A client watches /pods/ from RV 9: nothing to replay, wait for new events.
//! let w = cacher
//!     .start_watch(now, WatchRequest::new(KeyRange::Prefix(Key::from("/pods/")), RvParam::At(9)))
//!     .unwrap();
//!
//! // Storage reports a write at revision 10.
//! now = Timestamp::from_millis(10);
//! cacher.handle_put(now, Object::new(b"/pods/ns/b", Some(b"v1"), 10)).unwrap();
//!
//! let mut delivered = 0;
//! while let Some(out) = cacher.poll_output() {
//!     match out {
//!         Output::WatchStarted { watch, rv, .. } => assert_eq!((watch, rv), (w, 9)),
//!         Output::Fanout { event, targets } => {
//!             assert_eq!(event.rv(), 10);
//!             assert!(targets.iter().any(|t| t.watch == w));
//!             delivered += targets.len();
//!         }
//!         other => panic!("unexpected {other:?}"),
//!     }
//! }
//! assert_eq!(delivered, 1);
//!
//! // Time passes: timers (bookmark ticks, freshness waits, budgets) fire when due.
//! while let Some((deadline, _why)) = cacher.poll_timeout() {
//!     if deadline > Timestamp::from_millis(5_000) { break; }
//!     cacher.handle_timeout(deadline);
//!     while cacher.poll_output().is_some() {}
//! }
//! ```
//!
//! "A panic is a bug": no input, however malformed, panics the core. Bad input is a typed
//! error ([`Status`] for clients, [`StorageError`] for storage, [`ConfigError`] for
//! configuration) and leaves the state unchanged.

#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

mod bookmarks;
mod btree;
mod budget;
mod cacher;
mod config;
pub mod continue_token;
mod dispatch;
mod event;
#[doc(hidden)]
pub mod fuzzing;
mod hash;
mod interval;
mod key;
mod metrics;
mod object;
mod output;
mod reads;
mod ready;
mod request;
mod ring;
pub mod rng;
mod rv;
mod selector;
mod status;
mod store;
mod time;
mod waits;
mod watch;
mod watcher;

#[cfg(feature = "serde")]
pub mod replay;
pub mod simulate;

pub use btree::Tree;
pub use cacher::{
    Cacher, Change, StorageError, TimerReason, WatcherInfo, WatcherState, WatcherSummary, Window,
};
pub use config::{Config, ConfigError, Profile};
pub use event::Event;
pub use key::{display_key, has_path_prefix, prefix_end, Key, KeyRange};
pub use metrics::{Metrics, READ_WAIT_BUCKETS_MS};
pub use object::{Attrs, Object};
pub use output::{
    CachedRead, ChangeKind, CloseCause, InitialSource, Output, RangeOutcome, RangeRead,
    ReadOutcome, RequestId, Target, WatchEvent,
};
pub use ready::ReadyState;
pub use request::{
    ConsumeMode, GetRequest, ListRequest, RangeRequest, RvMatch, SlowPolicy, WatchRequest,
};
pub use rv::RvParam;
pub use selector::{
    FieldOp, FieldRequirement, FieldSelector, LabelOp, LabelRequirement, LabelSelector, Selector,
};
pub use status::{Reason, Status};
pub use time::Timestamp;

#[cfg(test)]
mod tests {
    fn assert_send<T: Send + Sync>() {}

    #[test]
    fn cacher_can_move_between_threads() {
        assert_send::<super::Cacher>();
        assert_send::<super::Output>();
    }
}
