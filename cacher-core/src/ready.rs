//! The ready gate: Pending ⇄ Ready → Stopped, with a generation.
//!
//! Kubernetes counterpart: `ready.go` (`set`, `stop`, `check`, `checkAndReadGeneration`,
//! `waitAndReadGeneration`; 1.33's last error and state-change time for Retry-After). Waiting is
//! not done here: the cacher parks requests and resumes them when the gate opens.

use alloc::string::String;

use crate::time::Timestamp;

/// The state of the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadyState {
    /// Not yet (re)initialised: no successful list since the last failure.
    Pending,
    /// Serving from the cache.
    Ready,
    /// Stopped for good.
    Stopped,
}

impl ReadyState {
    /// Lower-case name, as the trace and `/debug/state` spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            ReadyState::Pending => "pending",
            ReadyState::Ready => "ready",
            ReadyState::Stopped => "stopped",
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct ReadyGate {
    state: ReadyState,
    generation: u64,
    last_change: Timestamp,
    last_error: Option<String>,
}

impl ReadyGate {
    pub(crate) fn new(now: Timestamp) -> ReadyGate {
        ReadyGate { state: ReadyState::Pending, generation: 0, last_change: now, last_error: None }
    }

    /// `set(true)`: Pending → Ready, generation + 1. Returns true if the state changed.
    pub(crate) fn set_ready(&mut self, now: Timestamp) -> bool {
        if self.state != ReadyState::Pending {
            return false;
        }
        self.state = ReadyState::Ready;
        self.generation += 1;
        self.last_change = now;
        self.last_error = None;
        true
    }

    /// `set(false)`: Ready → Pending. Returns true if the state changed.
    pub(crate) fn set_pending(&mut self, now: Timestamp, error: Option<String>) -> bool {
        if error.is_some() && self.state != ReadyState::Stopped {
            self.last_error = error;
        }
        if self.state != ReadyState::Ready {
            return false;
        }
        self.state = ReadyState::Pending;
        self.last_change = now;
        true
    }

    /// `stop()`: terminal.
    pub(crate) fn stop(&mut self, now: Timestamp) {
        if self.state != ReadyState::Stopped {
            self.state = ReadyState::Stopped;
            self.last_change = now;
        }
    }

    pub(crate) fn state(&self) -> ReadyState {
        self.state
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.state == ReadyState::Ready
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    pub(crate) fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Retry-After for a 429 while not ready: 1.33's `int(clamp(e^(0.06·downtime_s), 1, 30))`.
    pub(crate) fn retry_after_s(&self, now: Timestamp) -> u32 {
        let downtime_s = now.ms_since(self.last_change) as f64 / 1000.0;
        let v = libm::exp(0.06 * downtime_s);
        if v >= 30.0 {
            30
        } else if v <= 1.0 {
            1
        } else {
            v as u32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_counts_transitions_into_ready() {
        // Test_newReadySetIdempotent.
        let t = Timestamp::ZERO;
        let mut g = ReadyGate::new(t);
        assert_eq!((g.generation(), g.is_ready()), (0, false));
        assert!(g.set_ready(t));
        assert_eq!((g.generation(), g.is_ready()), (1, true));
        assert!(!g.set_ready(t));
        assert_eq!(g.generation(), 1);
        assert!(g.set_pending(t, None));
        assert!(!g.set_pending(t, None));
        assert!(g.set_ready(t));
        assert_eq!(g.generation(), 2);
    }

    #[test]
    fn stop_is_terminal() {
        // Test_newReadyCheck.
        let t = Timestamp::ZERO;
        let mut g = ReadyGate::new(t);
        g.set_ready(t);
        g.stop(t);
        assert!(!g.is_ready());
        assert!(!g.set_ready(t));
        assert_eq!(g.state(), ReadyState::Stopped);
    }

    #[test]
    fn retry_after_table() {
        // TestCalculateRetryAfterForUnreadyCache (util_test.go, 1.33).
        let mut g = ReadyGate::new(Timestamp::ZERO);
        g.set_ready(Timestamp::ZERO);
        g.set_pending(Timestamp::ZERO, None);
        for (s, want) in [(0, 1), (5, 1), (10, 1), (14, 2), (20, 3), (30, 6), (40, 11), (540, 30)] {
            assert_eq!(g.retry_after_s(Timestamp::from_millis(s * 1000)), want, "{s}s");
        }
    }
}
