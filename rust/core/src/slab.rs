//! Requests live in a slab addressed by a `Handle` (index + generation), so
//! the hot loops never hash a string id. The generation makes a handle kept
//! in an in-flight step or a queue go stale once its slot is reused.

use crate::request::Request;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle {
    pub index: u32,
    pub generation: u32,
}

#[derive(Clone, Debug)]
struct Slot {
    generation: u32,
    request: Option<Request>,
}

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

    #[inline]
    pub fn get(&self, handle: Handle) -> Option<&Request> {
        let slot = self.slots.get(handle.index as usize)?;
        if slot.generation == handle.generation {
            slot.request.as_ref()
        } else {
            None
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
