"""The exceptions of watchcache: one class per failure a caller may want to handle."""

from typing import Optional


class WatchCacheError(Exception):
    """Base of every watchcache error. Carries the HTTP-style ``code``, the Kubernetes
    status ``reason``, the ``message`` and, where a client should retry, ``retry_after_s``.

    >>> import watchcache
    >>> try:
    ...     watchcache.Cacher().start_watch(0, "/pods/", rv="ten")
    ... except watchcache.InvalidRequest as e:
    ...     print(e.code, e.reason)
    400 BadRequest
    """

    def __init__(self, code: int, reason: str, message: str, retry_after_s: Optional[int] = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.retry_after_s = retry_after_s

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code}, {self.reason!r}, {self.message!r})"


class InvalidRequest(WatchCacheError, ValueError):
    """400 (a malformed request: resourceVersion, selector, key, continue token...) or 422
    Invalid (list options that fail validation)."""


class NotFound(WatchCacheError, LookupError):
    """404: the object does not exist."""


class ResourceExpired(WatchCacheError):
    """410 Expired: the requested resourceVersion is older than the cache's window."""


class TooLargeResourceVersion(WatchCacheError):
    """504 Timeout: the cache did not reach the requested resourceVersion within 3 s."""


class NotReady(WatchCacheError):
    """429 (1.31+: the cache is (re)initialising) or 503 (stopped, or a wait abandoned)."""


class ScenarioError(WatchCacheError, ValueError):
    """A malformed scenario: the message names the step and field."""


class ConfigError(WatchCacheError, ValueError):
    """A bad configuration value: the message names the field."""


class StorageInputError(WatchCacheError, ValueError):
    """Storage input the core refuses (an RV going back, a delete of an unknown key...);
    the cache's state is unchanged."""


def raise_for(output: object) -> None:
    """Raises the typed exception of a ``Rejected`` or ``WatchError`` output; does nothing
    for any other output.

    >>> import watchcache
    >>> c = watchcache.Cacher(profile="v1.34")
    >>> w = c.start_watch(0, "/pods/", rv="0")
    >>> [watchcache.raise_for(o) for o in c.drain()]
    Traceback (most recent call last):
    ...
    watchcache._errors.NotReady: storage is (re)initializing
    """
    err = getattr(output, "error", None)
    if isinstance(err, WatchCacheError):
        raise err
