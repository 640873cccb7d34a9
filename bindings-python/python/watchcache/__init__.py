"""watchcache: the Kubernetes apiserver's watch cache ("cacher"), for notebooks.

The same sans-IO core as the ``watchcache`` server and the browser demo, driven from Python
with explicit time:

- :func:`replay` runs a scenario (the conformance language of ``scenarios/``) and returns its
  trace as a list of dicts (``pandas.DataFrame(trace)`` works as is);
- :class:`Cacher` is the core itself: feed storage events and client requests with ``now_ms``,
  read what it does with :meth:`Cacher.drain`;
- :func:`simulate` runs a workload (writes, watchers, disconnects, compactions, restarts)
  against the core in simulated time and returns a report: totals and one record per second
  (``pandas.DataFrame(report["series"])``).

Resource versions are Python ints. Errors are subclasses of :class:`WatchCacheError`.
"""

from ._core import (
    Cacher,
    Item,
    NeedCurrentRevision,
    RangeResult,
    ReadResult,
    Rejected,
    Relist,
    RequestProgress,
    WatchClosed,
    WatchDelegated,
    WatchError,
    WatcherInfo,
    WatchItem,
    WatchStarted,
    Window,
    __version__,
    replay,
    replay_json,
    simulate,
)
from ._errors import (
    ConfigError,
    InvalidRequest,
    NotFound,
    NotReady,
    ResourceExpired,
    ScenarioError,
    StorageInputError,
    TooLargeResourceVersion,
    WatchCacheError,
    raise_for,
)

__all__ = [
    "Cacher",
    "ConfigError",
    "InvalidRequest",
    "Item",
    "NeedCurrentRevision",
    "NotFound",
    "NotReady",
    "RangeResult",
    "ReadResult",
    "Rejected",
    "Relist",
    "RequestProgress",
    "ResourceExpired",
    "ScenarioError",
    "StorageInputError",
    "TooLargeResourceVersion",
    "WatchCacheError",
    "WatchClosed",
    "WatchDelegated",
    "WatchError",
    "WatchItem",
    "WatchStarted",
    "WatcherInfo",
    "Window",
    "__version__",
    "raise_for",
    "replay",
    "replay_json",
    "simulate",
]
