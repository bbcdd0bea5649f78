//! Prompts given as embeddings (vLLM's `prompt_embeds`): their token ids are placeholders,
//! so each block's key of the embeddings is what tells two prompts apart in the prefix
//! cache.

mod common;

use common::*;
use llmsched_core::{CoreError, NewRequest, Scheduler};

/// A 12-token prompt of placeholder ids whose blocks of 4 carry `keys`.
fn embedded(id: &str, keys: &[&str]) -> NewRequest {
    NewRequest {
        prompt_token_ids: vec![0; 12],
        prompt_embeds_keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
        ..request(id, 12, 4)
    }
}

fn caching() -> Scheduler {
    Scheduler::new(config(|p| {
        p.enable_prefix_caching = true;
        p.block_size = 4;
    }))
    .unwrap()
}

#[test]
fn requests_share_cached_blocks_only_as_far_as_their_embeddings_match() {
    let mut sched = caching();
    sched.add_request(embedded("first", &["x", "y", "z"])).unwrap();
    let step = sched.schedule();
    let (tokens, counts) = sample(&sched, &step, false);
    apply(&mut sched, &step, &tokens, &counts);
    let token_ids = NewRequest { prompt_token_ids: vec![0; 12], ..request("token-ids", 12, 4) };
    for (new, hit) in [
        (embedded("same", &["x", "y", "z"]), 8),
        (embedded("last-block-differs", &["x", "y", "w"]), 8),
        (embedded("second-block-differs", &["x", "v", "z"]), 4),
        (embedded("other", &["u", "y", "z"]), 0),
        // The same placeholder ids as token ids: not the first request's prompt.
        (token_ids, 0),
    ] {
        let id = new.request_id.clone();
        let h = sched.add_request(new).unwrap();
        assert_eq!(sched.prefix_cache_hit_tokens(sched.request(h).unwrap()), hit, "{id}");
    }
}

#[test]
fn a_prompt_of_embeddings_needs_a_key_per_block_it_reaches() {
    let mut sched = caching();
    let before = sched.debug_snapshot();
    for keys in [&["x", "y"][..], &["x", "y", "z", "w"]] {
        match sched.add_request(embedded("r", keys)) {
            Err(CoreError::InvalidRequest { field, value, reason }) => {
                assert_eq!(field, "prompt_embeds_keys");
                assert_eq!(value, format!("{} keys", keys.len()));
                assert!(reason.contains("3 for 12 tokens in blocks of 4"), "{reason}");
            }
            other => panic!("expected an invalid prompt_embeds_keys, got {other:?}"),
        }
    }
    let session = NewRequest { resumable: true, ..embedded("s", &["x", "y", "z"]) };
    assert!(matches!(
        sched.add_request(session),
        Err(CoreError::InvalidRequest { ref field, ref reason, .. })
            if field == "prompt_embeds_keys" && reason.contains("streaming-input")
    ));
    assert_eq!(sched.debug_snapshot(), before);
    // A partial last block has its key too: 10 tokens reach 3 blocks.
    let ten = NewRequest { prompt_token_ids: vec![0; 10], ..embedded("ten", &["x", "y", "z"]) };
    assert!(sched.add_request(ten).is_ok());
}
