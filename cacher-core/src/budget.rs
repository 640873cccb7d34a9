//! The time budget that dispatch may spend waiting on blocked watchers.
//!
//! Kubernetes counterpart: `time_budget.go`: a token bucket refilled at 50 ms per second up to
//! 100 ms, starting empty. `take_available` hands out the whole budget; `return_unused` gives
//! back what a wait did not use. Kept in microseconds so refills are exact.

use crate::time::Timestamp;

#[derive(Clone, Debug)]
pub(crate) struct TimeBudget {
    budget_us: u64,
    max_us: u64,
    refill_ms_per_s: u64,
    last: Timestamp,
}

impl TimeBudget {
    pub(crate) fn new(now: Timestamp, refill_ms_per_s: u64, max_ms: u64) -> TimeBudget {
        TimeBudget { budget_us: 0, max_us: max_ms.saturating_mul(1000), refill_ms_per_s, last: now }
    }

    /// Refills for the time since the last take (none if the clock went back), caps, and
    /// returns the whole budget in milliseconds (rounded down), leaving it empty.
    pub(crate) fn take_available(&mut self, now: Timestamp) -> u64 {
        if now > self.last {
            // elapsed_ms × refill (ms per s) = refill in µs.
            let refill = now.ms_since(self.last).saturating_mul(self.refill_ms_per_s);
            self.budget_us = self.budget_us.saturating_add(refill);
        }
        self.budget_us = self.budget_us.min(self.max_us);
        self.last = now;
        let taken_ms = self.budget_us / 1000;
        self.budget_us -= taken_ms * 1000;
        taken_ms
    }

    /// Gives back unused milliseconds, capped at the maximum.
    pub(crate) fn return_unused(&mut self, unused_ms: u64) {
        self.budget_us =
            self.budget_us.saturating_add(unused_ms.saturating_mul(1000)).min(self.max_us);
    }

    pub(crate) fn available_ms(&self) -> u64 {
        self.budget_us / 1000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_budget_sequence() {
        // TestTimeBudget (time_budget_test.go): max 200 ms, refill 50 ms/s.
        let mut now = Timestamp::from_millis(1_000_000);
        let mut b = TimeBudget::new(now, 50, 200);
        assert_eq!(b.take_available(now), 0);
        now = now.add_ms(10_000);
        assert_eq!(b.take_available(now), 200);
        now = now.add_ms(2_000);
        assert_eq!(b.take_available(now), 100);
        b.return_unused(50);
        assert_eq!(b.take_available(now), 50);
        // Returning a negative duration is ignored; here "nothing".
        b.return_unused(0);
        assert_eq!(b.take_available(now), 0);
        // Clock back 2 minutes: nothing refills.
        let back = Timestamp::from_millis(now.as_millis() - 120_000);
        assert_eq!(b.take_available(back), 0);
        // Forward 10 minutes from there: capped.
        let fwd = back.add_ms(600_000);
        assert_eq!(b.take_available(fwd), 200);
        b.return_unused(10_000);
        let back2 = Timestamp::from_millis(fwd.as_millis() - 120_000);
        assert_eq!(b.take_available(back2), 200);
    }
}
