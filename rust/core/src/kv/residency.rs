//! KV cache residency metrics (vLLM's `kv_cache_metrics`): for a sample of the blocks the
//! pool hands out, how long each lived, how long it sat unread before it was reused, and
//! the gaps between its last reads. Off (`kv_cache_metrics_sample` 0), nothing is built.
//!
//! vLLM's rules: a block is sampled when the pool hands it out (each with probability
//! `kv_cache_metrics_sample`); a prefix hit that takes it is a read (the last four are
//! kept; the handing out is none); with prefix caching
//! on, a sampled block handed out again is evicted (an event records its lifetime, idle
//! time and read gaps) and sampled anew; resetting the prefix cache forgets every sampled
//! block and every event not taken yet.

use std::time::Instant;

use rustc_hash::FxHashMap;

/// The reads of a block whose gaps an event reports: the last four (three gaps).
const READS_KEPT: usize = 4;

/// One sampled block evicted: seconds since it was handed out, since its last read, and
/// between its last reads (oldest first; up to three).
#[derive(Clone, Debug, PartialEq)]
pub struct EvictionEvent {
    pub lifetime_seconds: f64,
    pub idle_seconds: f64,
    pub reuse_gaps_seconds: Vec<f64>,
}

#[derive(Clone, Debug)]
struct Sampled {
    born: Instant,
    /// The last reads, at most `READS_KEPT`, oldest first.
    reads: Vec<Instant>,
}

#[derive(Clone, Debug)]
pub struct Residency {
    /// A block is sampled when `rng < threshold` (the sample rate, scaled to u64).
    threshold: u64,
    rng: u64,
    sampled: FxHashMap<u32, Sampled>,
    events: Vec<EvictionEvent>,
}

impl Residency {
    /// `sample_rate` in (0, 1]: the fraction of handed-out blocks sampled.
    pub fn new(sample_rate: f64) -> Self {
        let threshold = if sample_rate >= 1.0 { u64::MAX } else { (sample_rate * u64::MAX as f64) as u64 };
        Self { threshold, rng: 0x853c_49e6_748f_ea9b, sampled: FxHashMap::default(), events: Vec::new() }
    }

    /// SplitMix64: a fixed sequence, so a run samples the same blocks every time.
    fn draw(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The pool hands `block` out: a sampled block still tracked is evicted first (when
    /// prefix caching is on: `evicts`), then the block may be sampled anew.
    pub fn handed_out(&mut self, block: u32, evicts: bool, now: Instant) {
        if evicts {
            if let Some(state) = self.sampled.remove(&block) {
                self.events.push(state.evicted(now));
            }
        }
        if self.threshold == u64::MAX || self.draw() < self.threshold {
            self.sampled.insert(block, Sampled { born: now, reads: Vec::new() });
        } else {
            self.sampled.remove(&block);
        }
    }

    /// A prefix hit takes `block`.
    pub fn read(&mut self, block: u32, now: Instant) {
        if let Some(state) = self.sampled.get_mut(&block) {
            if state.reads.len() == READS_KEPT {
                state.reads.remove(0);
            }
            state.reads.push(now);
        }
    }

    /// The prefix cache was reset: every sampled block and pending event is forgotten.
    pub fn reset(&mut self) {
        self.sampled.clear();
        self.events.clear();
    }

    /// The events since the last call, in eviction order.
    pub fn take_events(&mut self) -> Vec<EvictionEvent> {
        std::mem::take(&mut self.events)
    }
}

impl Sampled {
    fn evicted(self, now: Instant) -> EvictionEvent {
        EvictionEvent {
            lifetime_seconds: now.duration_since(self.born).as_secs_f64(),
            // Idle since its last read, or since it was handed out if never read.
            idle_seconds: now.duration_since(self.reads.last().copied().unwrap_or(self.born)).as_secs_f64(),
            reuse_gaps_seconds: self.reads.windows(2).map(|w| w[1].duration_since(w[0]).as_secs_f64()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn an_evicted_block_reports_its_lifetime_idle_time_and_read_gaps() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut r = Residency::new(1.0);
        r.handed_out(7, true, at(0));
        // One read: no gap yet (the handing out is not a read).
        r.read(7, at(10));
        r.handed_out(9, true, at(10));
        r.read(9, at(20));
        r.handed_out(9, true, at(25));
        assert_eq!(r.take_events()[0].reuse_gaps_seconds, Vec::<f64>::new());
        for ms in [20, 30, 60, 100] {
            r.read(7, at(ms));
        }
        // Reads of a block never sampled are ignored.
        r.read(8, at(50));
        assert!(r.take_events().is_empty());
        r.handed_out(7, true, at(150));
        let events = r.take_events();
        assert_eq!(events.len(), 1);
        let e = &events[0];
        assert!((e.lifetime_seconds - 0.150).abs() < 1e-9, "{e:?}");
        assert!((e.idle_seconds - 0.050).abs() < 1e-9, "{e:?}");
        // Reads at 10, 20, 30, 60 and 100 ms: the last four keep gaps of 10, 30 and 40 ms.
        let gaps: Vec<i64> = e.reuse_gaps_seconds.iter().map(|g| (g * 1000.0).round() as i64).collect();
        assert_eq!(gaps, [10, 30, 40]);
        // Sampled anew at its second handing out; without prefix caching nothing is evicted.
        r.handed_out(7, false, at(200));
        assert!(r.take_events().is_empty());
        r.reset();
        r.handed_out(7, true, at(300));
        assert!(r.take_events().is_empty());
    }

    #[test]
    fn about_the_sample_rate_of_blocks_is_sampled() {
        let mut r = Residency::new(0.25);
        let now = Instant::now();
        for block in 0..4000 {
            r.handed_out(block, true, now);
        }
        let sampled = r.sampled.len();
        assert!((800..1200).contains(&sampled), "{sampled} of 4000 at 0.25");
    }
}
