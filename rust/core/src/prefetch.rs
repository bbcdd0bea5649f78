//! Software prefetch for the loops over a step's requests. A loop over a step reads each
//! request's slot lines (the core's loops) or its Python id object (the binding's) once;
//! after a model step they are no longer in the CPU caches, and when the requests' order
//! is not their memory's order (requests finish and new ones take their slots), the CPU's
//! own prefetchers cannot guess the next address. A loop body long enough to hold only a
//! load or two in flight then waits for each request in turn; asking for the lines of the
//! request some iterations ahead keeps several loads in flight. (Public for the binding.)

/// How many requests ahead a loop over a step asks for a request's lines: eight iterations
/// of the loops (a few dozen instructions each) cover a load from memory.
pub const DISTANCE: usize = 8;

/// Starts loading the cache line holding `address` into every cache level. A hint: any
/// address is fine, valid or not, and nothing waits for it.
#[inline(always)]
pub fn prefetch<T>(address: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86_64's baseline, and a prefetch never faults, whatever the
    // address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(address.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}
