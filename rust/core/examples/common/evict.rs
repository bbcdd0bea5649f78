//! The examples' cold mode, as `llmsched bench --cold-mib` has it: before each timed call,
//! write every cache line of `mib` MiB of other memory (a model step's host-side work), so
//! the call starts with the scheduler's data out of the CPU caches.

pub struct Evictor(Vec<u8>);

impl Evictor {
    /// `None` for 0 MiB (warm).
    pub fn new(mib: usize) -> Option<Self> {
        (mib > 0).then(|| Self(vec![1; mib << 20]))
    }

    pub fn evict(&mut self) {
        for line in self.0.chunks_exact_mut(64) {
            line[0] = line[0].wrapping_add(1);
        }
        std::hint::black_box(&mut self.0);
    }
}
