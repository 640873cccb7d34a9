//! The host's clock: the only place time comes from. The core takes `now` as milliseconds
//! since the server started; timers it asks for map back to tokio instants.

use cacher_core::Timestamp;
use tokio::time::Instant;

/// Milliseconds since a fixed start.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Clock {
        Clock { start: Instant::now() }
    }

    /// Now, for the core.
    pub fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.start.elapsed().as_millis() as u64)
    }

    /// The instant of a core timestamp.
    pub fn instant_of(&self, t: Timestamp) -> Instant {
        self.start + std::time::Duration::from_millis(t.as_millis().min(u64::MAX / 4))
    }
}
