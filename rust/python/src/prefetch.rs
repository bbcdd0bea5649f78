//! Software prefetch for the binding's loops over a step's requests. Each reads one Python
//! id object per request; when a model step ran in between, they are no longer in the CPU
//! caches, and a loop body long enough to hold only a load or two in flight waits for each
//! in turn. Asking for the object of a request some iterations ahead keeps several loads
//! in flight.

/// How many requests ahead a loop asks for a request's id object: eight iterations
/// of the binding's loops over ids (a few dozen instructions each) cover a load from
/// memory.
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
