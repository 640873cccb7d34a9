//! Time as an input.
//!
//! The core never reads a clock: every mutating call takes a [`Timestamp`] chosen by the host
//! (monotonic milliseconds). Kubernetes counterpart: the `clock.Clock` that `cacher.go`,
//! `watch_cache.go` and `time_budget.go` are given, which tests replace by a fake clock.

/// A point in time, in milliseconds on the host's monotonic clock.
///
/// Only differences between timestamps mean anything; the origin is the host's choice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The origin of the host's clock.
    pub const ZERO: Timestamp = Timestamp(0);
    /// The last representable instant; used for "never".
    pub const MAX: Timestamp = Timestamp(u64::MAX);

    /// A timestamp `ms` milliseconds after the origin.
    pub const fn from_millis(ms: u64) -> Timestamp {
        Timestamp(ms)
    }

    /// Milliseconds since the origin.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// This instant plus `ms` milliseconds, saturating at [`Timestamp::MAX`].
    pub const fn add_ms(self, ms: u64) -> Timestamp {
        Timestamp(self.0.saturating_add(ms))
    }

    /// Milliseconds from `earlier` to `self`, or 0 if `earlier` is later.
    pub const fn ms_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl core::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}ms", self.0)
    }
}
