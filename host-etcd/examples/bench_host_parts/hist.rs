//! A log-linear latency histogram (microseconds, 64 sub-buckets per power of two: < 1.6 %),
//! and a set of shards of it that many tasks record into.

use std::sync::Mutex;

use serde_json::{json, Value};

const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = (2 * SUB + (64 - SUB_BITS as u64 - 1) * SUB) as usize;

#[derive(Clone)]
pub(crate) struct Hist {
    counts: Vec<u32>,
    pub(crate) total: u64,
    pub(crate) max_us: u64,
}

impl Hist {
    pub(crate) fn new() -> Hist {
        Hist { counts: vec![0; BUCKETS], total: 0, max_us: 0 }
    }

    fn index(v: u64) -> usize {
        if v < 2 * SUB {
            return v as usize;
        }
        let msb = 63 - v.leading_zeros() as u64;
        let shift = msb - SUB_BITS as u64;
        let mantissa = v >> shift;
        (2 * SUB + (msb - SUB_BITS as u64 - 1) * SUB + (mantissa - SUB)) as usize
    }

    /// The middle of a bucket.
    fn value(idx: usize) -> f64 {
        let idx = idx as u64;
        if idx < 2 * SUB {
            return idx as f64;
        }
        let k = idx - 2 * SUB;
        let msb = k / SUB + SUB_BITS as u64 + 1;
        let shift = msb - SUB_BITS as u64;
        let mantissa = SUB + k % SUB;
        let lo = mantissa << shift;
        lo as f64 + ((1u64 << shift) as f64 - 1.0) / 2.0
    }

    pub(crate) fn record(&mut self, us: u64) {
        let i = Self::index(us).min(BUCKETS - 1);
        self.counts[i] = self.counts[i].saturating_add(1);
        self.total += 1;
        self.max_us = self.max_us.max(us);
    }

    pub(crate) fn merge(&mut self, o: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a = a.saturating_add(*b);
        }
        self.total += o.total;
        self.max_us = self.max_us.max(o.max_us);
    }

    pub(crate) fn quantile_ms(&self, q: f64) -> Option<f64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            seen += u64::from(*c);
            if seen >= rank {
                return Some((Self::value(i) / 1000.0).min(self.max_us as f64 / 1000.0));
            }
        }
        Some(self.max_us as f64 / 1000.0)
    }

    /// samples, p50, p90, p99, p99.9, max (ms, three decimals).
    pub(crate) fn summary(&self) -> Value {
        let r = |x: Option<f64>| x.map(|v| (v * 1000.0).round() / 1000.0);
        json!({
            "samples": self.total,
            "p50": r(self.quantile_ms(0.50)),
            "p90": r(self.quantile_ms(0.90)),
            "p99": r(self.quantile_ms(0.99)),
            "p999": r(self.quantile_ms(0.999)),
            "max": if self.total == 0 { Value::Null } else { json!(self.max_us as f64 / 1000.0) },
        })
    }
}

/// Histograms that many tasks record into, each task into its own shard (one lock per
/// response, never contended in practice).
pub(crate) struct Shards(Vec<Mutex<Hist>>);

impl Shards {
    pub(crate) fn new(n: usize) -> Shards {
        Shards((0..n.max(1)).map(|_| Mutex::new(Hist::new())).collect())
    }

    pub(crate) fn shard(&self, i: usize) -> &Mutex<Hist> {
        &self.0[i % self.0.len()]
    }

    pub(crate) fn record(&self, i: usize, us: u64) {
        if let Ok(mut h) = self.shard(i).lock() {
            h.record(us);
        }
    }

    /// The merged histogram; the shards start again empty.
    pub(crate) fn take(&self) -> Hist {
        let mut h = Hist::new();
        for s in &self.0 {
            if let Ok(mut x) = s.lock() {
                h.merge(&x);
                *x = Hist::new();
            }
        }
        h
    }
}
