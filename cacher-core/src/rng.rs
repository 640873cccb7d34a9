//! The core's only randomness: SplitMix64 seeded by the configuration, so every host draws the
//! same numbers. Kubernetes counterpart: `wait.Jitter` for the dispatch tick in `cacher.go`.
//! Public for the simulator's world and the hosts' seeded tests, which draw the same way.

#[derive(Clone, Debug)]
/// SplitMix64: a seeded generator.
pub struct Rng(u64);

impl Rng {
    /// Seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform integer in `0..=max`.
    pub fn up_to(&mut self, max: u64) -> u64 {
        if max == u64::MAX {
            return self.next_u64();
        }
        self.next_u64() % (max + 1)
    }
}
