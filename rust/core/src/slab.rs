//! Requests live in a slab addressed by a `Handle` (index + generation), so
//! the hot loops never hash a string id. The generation makes a handle kept
//! in an in-flight step or a queue go stale once its slot is reused.

use crate::request::Request;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle {
    pub index: u32,
    pub generation: u32,
}

/// Aligned to a cache line, so the fields `Request` keeps first for the step loops (and
/// the generation every lookup checks) fill whole lines of their own.
#[derive(Clone, Debug)]
#[repr(C, align(64))]
struct Slot {
    generation: u32,
    request: Option<Request>,
}

/// A cache line's size: the slot's alignment.
const CACHE_LINE: usize = std::mem::align_of::<Slot>();

#[derive(Clone, Debug, Default)]
pub struct Slab {
    slots: Vec<Slot>,
    free: Vec<u32>,
    len: usize,
}

impl Slab {
    pub fn insert(&mut self, request: Request) -> Handle {
        self.len += 1;
        if let Some(index) = self.free.pop() {
            let slot = &mut self.slots[index as usize];
            slot.request = Some(request);
            Handle { index, generation: slot.generation }
        } else {
            let index = self.slots.len() as u32;
            self.slots.push(Slot { generation: 0, request: Some(request) });
            Handle { index, generation: 0 }
        }
    }

    /// Frees the slot; the handle (and every copy of it) goes stale.
    pub fn remove(&mut self, handle: Handle) -> Option<Request> {
        let slot = self.slots.get_mut(handle.index as usize)?;
        if slot.generation != handle.generation {
            return None;
        }
        let request = slot.request.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(handle.index);
        self.len -= 1;
        Some(request)
    }

    /// Slots ever used: every handle's index is below it.
    pub fn num_slots(&self) -> usize {
        self.slots.len()
    }

    #[inline]
    pub fn get(&self, handle: Handle) -> Option<&Request> {
        let slot = self.slots.get(handle.index as usize)?;
        if slot.generation == handle.generation {
            slot.request.as_ref()
        } else {
            None
        }
    }

    /// Starts loading the first `lines` cache lines of the handle's slot. Reads nothing: the
    /// address follows from the index, so the load starts without waiting for another,
    /// and any handle is fine (a prefetch never faults).
    #[inline(always)]
    pub fn prefetch(&self, handle: Handle, lines: usize) {
        let slot = self.slots.as_ptr().wrapping_add(handle.index as usize).cast::<u8>();
        for line in 0..lines {
            crate::prefetch::prefetch(slot.wrapping_add(line * CACHE_LINE));
        }
    }

    #[inline]
    pub fn get_mut(&mut self, handle: Handle) -> Option<&mut Request> {
        let slot = self.slots.get_mut(handle.index as usize)?;
        if slot.generation == handle.generation {
            slot.request.as_mut()
        } else {
            None
        }
    }

    pub fn requests_mut(&mut self) -> impl Iterator<Item = &mut Request> {
        self.slots.iter_mut().filter_map(|slot| slot.request.as_mut())
    }

    pub fn iter(&self) -> impl Iterator<Item = (Handle, &Request)> {
        self.slots.iter().enumerate().filter_map(|(index, slot)| {
            slot.request.as_ref().map(|r| (Handle { index: index as u32, generation: slot.generation }, r))
        })
    }
}

impl std::ops::Index<Handle> for Slab {
    type Output = Request;
    #[inline]
    fn index(&self, handle: Handle) -> &Request {
        self.get(handle).expect("a live handle")
    }
}

impl std::ops::IndexMut<Handle> for Slab {
    #[inline]
    fn index_mut(&mut self, handle: Handle) -> &mut Request {
        self.get_mut(handle).expect("a live handle")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::UPDATE_LINES;

    /// A decode step reads and writes these fields of every scheduled request: they, and
    /// the generation, must sit in the slot's first three cache lines, the output tokens
    /// (which the update appends to) in a line of their own.
    #[test]
    fn the_step_fields_fill_the_first_three_cache_lines() {
        assert_eq!(CACHE_LINE, 64);
        let request = std::mem::offset_of!(Slot, request);
        let hot_end = Request::hot_fields().into_iter().map(|(offset, size)| request + offset + size).max().unwrap();
        assert!(hot_end <= UPDATE_LINES * CACHE_LINE, "the step's fields end at byte {hot_end} of the slot");
        assert!(std::mem::offset_of!(Slot, generation) < CACHE_LINE);
        let output = request + Request::OUTPUT_OFFSET;
        assert_eq!(output % CACHE_LINE, 0, "the output tokens start at byte {output} of the slot");
    }
}
