//! A request's multimodal inputs (an image's placeholder tokens in its prompt), checked
//! at `add_request`, and which of their encoder outputs the request references. The encoder
//! cache that holds those outputs is the scheduler's (`encoder`).

use std::sync::Arc;

use crate::error::{CoreError, CoreResult};

/// One encoder input of a request, as `add_request` takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MmInputSpec {
    /// What identifies its encoder output: inputs with the same identifier share one.
    pub identifier: String,
    /// Where its placeholder tokens start in the prompt.
    pub offset: i64,
    /// How many placeholder tokens it has.
    pub length: i64,
    /// Which placeholder tokens carry an embedding (vLLM's `PlaceholderRange.is_embed`);
    /// None: all of them.
    pub is_embed: Option<Vec<bool>>,
}

/// A request's encoder input, checked.
#[derive(Clone, Debug)]
pub struct MmInput {
    pub identifier: Arc<str>,
    pub offset: i64,
    pub length: i64,
    /// The embeddings among the first `i + 1` placeholders, for each `i` (None: every
    /// placeholder is one).
    embeds_cumsum: Option<Box<[u32]>>,
}

impl MmInput {
    /// One past its last placeholder.
    #[inline]
    pub fn end(&self) -> i64 {
        self.offset + self.length
    }

    /// Its embeddings: the encoder cache space and compute budget it takes.
    pub fn num_embeds(&self) -> i64 {
        match &self.embeds_cumsum {
            None => self.length,
            Some(cumsum) => cumsum.last().map_or(0, |&e| i64::from(e)),
        }
    }

    /// Its embeddings among placeholders `[start, end)` (relative to its offset).
    pub fn embeds_between(&self, start: i64, end: i64) -> i64 {
        match &self.embeds_cumsum {
            None => end - start,
            Some(cumsum) => {
                let upto = |i: i64| if i > 0 { i64::from(cumsum[i as usize - 1]) } else { 0 };
                upto(end) - upto(start)
            }
        }
    }
}

/// How large a request's encoder inputs may be.
#[derive(Clone, Copy, Debug)]
pub(crate) struct InputLimits {
    /// The most embeddings (the encoder cache's size and the compute budget: a larger input
    /// could never be encoded).
    pub embeds: i64,
    /// Without chunked inputs, the most placeholders (with the drafter's shift) one step can
    /// give a request: a longer input could never be scheduled whole. None: chunked inputs.
    pub whole_placeholders: Option<i64>,
}

/// A request's encoder inputs checked against its prompt: each non-empty with a
/// non-empty identifier, within the prompt, in prompt order without overlapping, and
/// within `limits`.
pub(crate) fn check_mm_inputs(
    specs: Vec<MmInputSpec>,
    prompt_len: i64,
    limits: InputLimits,
) -> CoreResult<Box<[MmInput]>> {
    let largest = limits.embeds;
    let mut inputs = Vec::with_capacity(specs.len());
    let mut previous_end = 0;
    for (i, spec) in specs.into_iter().enumerate() {
        let field = |name: &str| format!("mm_inputs[{i}].{name}");
        if largest == 0 {
            return Err(CoreError::request(
                "mm_inputs",
                format!("[{i}]"),
                "this scheduler has no encoder budget (max_num_encoder_input_tokens=0): multimodal inputs are off",
            ));
        }
        if spec.identifier.is_empty() {
            return Err(CoreError::request(field("identifier"), "''", "must be a non-empty string"));
        }
        if spec.length < 1 {
            return Err(CoreError::request(field("length"), spec.length, "must be at least 1"));
        }
        if spec.offset < previous_end || spec.offset + spec.length > prompt_len {
            return Err(CoreError::request(
                field("offset"),
                spec.offset,
                format!(
                    "placeholders [{}, {}) must lie in the prompt ({prompt_len} tokens), after the previous input's \
                     (which end at {previous_end})",
                    spec.offset,
                    spec.offset + spec.length
                ),
            ));
        }
        let embeds_cumsum = match spec.is_embed {
            None => None,
            Some(flags) => {
                if flags.len() as i64 != spec.length {
                    return Err(CoreError::request(
                        field("is_embed"),
                        format!("{} flags", flags.len()),
                        format!("must have one flag per placeholder ({})", spec.length),
                    ));
                }
                let mut total = 0u32;
                Some(
                    flags
                        .iter()
                        .map(|&f| {
                            total += u32::from(f);
                            total
                        })
                        .collect(),
                )
            }
        };
        let input =
            MmInput { identifier: spec.identifier.into(), offset: spec.offset, length: spec.length, embeds_cumsum };
        if input.num_embeds() > largest {
            return Err(CoreError::request(
                field("length"),
                spec.length,
                format!(
                    "its {} embeddings exceed the encoder budget ({largest}: the smaller of \
                     max_num_encoder_input_tokens and encoder_cache_size): it could never be encoded",
                    input.num_embeds()
                ),
            ));
        }
        if let Some(most) = limits.whole_placeholders {
            if spec.length > most {
                return Err(CoreError::request(
                    field("length"),
                    spec.length,
                    format!(
                        "with disable_chunked_mm_input, an input is scheduled whole, but one step gives a \
                         request at most {most} placeholders (the token budget, the long-prefill threshold, \
                         less the drafter's shift): it could never be scheduled"
                    ),
                ));
            }
        }
        previous_end = input.end();
        inputs.push(input);
    }
    Ok(inputs.into_boxed_slice())
}

/// The indices `[lo, hi)` of the inputs whose placeholders overlap tokens `[start, end)`
/// (vLLM's `get_mm_features_in_window`; inputs are in prompt order).
pub(crate) fn inputs_in_window(inputs: &[MmInput], start: i64, end: i64) -> (usize, usize) {
    let lo = inputs.partition_point(|input| input.end() < start + 1);
    let hi = inputs.partition_point(|input| input.offset < end);
    (lo, hi.max(lo))
}

/// A request's multimodal state: its inputs and those whose cached outputs it references.
#[derive(Clone, Debug, Default)]
pub(crate) struct RequestInputs {
    pub inputs: Box<[MmInput]>,
    /// The inputs whose encoder outputs the request references (allocated or found
    /// cached), ascending.
    pub referenced: Vec<u32>,
}

impl RequestInputs {
    /// Whether an input it references has this identifier.
    pub fn references_identifier(&self, identifier: &str) -> bool {
        self.referenced.iter().any(|&i| &*self.inputs[i as usize].identifier == identifier)
    }

    /// Records that it references input `i`'s output.
    pub fn add_reference(&mut self, i: usize) {
        if let Err(at) = self.referenced.binary_search(&(i as u32)) {
            self.referenced.insert(at, i as u32);
        }
    }
}
