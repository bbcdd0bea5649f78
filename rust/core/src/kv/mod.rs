//! The paged KV cache: the block pool and the manager that hands blocks to requests.

pub mod block_pool;
pub mod manager;

pub use block_pool::{BlockPool, NULL_BLOCK};
pub use manager::{KvManager, SlotRequest};
