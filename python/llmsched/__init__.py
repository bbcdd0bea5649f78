"""llmsched: the request scheduler of an LLM serving engine.

vLLM v1's scheduling decisions, made in Rust: ``Scheduler.schedule()`` says
which requests run this step and how many tokens each, as numpy arrays;
``update_from_output()`` applies what the model runner sampled. Every
scheduled request keeps ``C + n + s <= max_model_len``.
"""

from collections.abc import Sequence as _Sequence

from llmsched._core import (
    CachedBlocks,
    ConfigError,
    DuplicateRequestError,
    InternalError,
    InvalidRequestError,
    InvariantError,
    LlmschedError,
    OutputMismatchError,
    ReentrantCallError,
    Request,
    RequestOutput,
    RequestOutputs,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    UnknownRequestError,
    __version__,
)
from llmsched.outputs import ModelRunnerOutput
from llmsched.status import RequestStatus

__all__ = [
    "CachedBlocks",
    "ConfigError",
    "DuplicateRequestError",
    "Engine",
    "InternalError",
    "InvalidRequestError",
    "InvariantError",
    "LlmschedError",
    "ModelRunnerOutput",
    "OutputMismatchError",
    "ReentrantCallError",
    "Request",
    "RequestOutput",
    "RequestOutputs",
    "RequestStatus",
    "RequestSummary",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "SimulatedModelRunner",
    "UnknownRequestError",
    "__version__",
]

# A step's outputs behave as a read-only sequence of RequestOutput.
_Sequence.register(RequestOutputs)

# The simulator's classes, importable from here as before; loaded on first use, so that an
# engine importing the scheduler does not load the simulator.
_FROM_SIM = frozenset({"Engine", "RequestSummary", "SimulatedModelRunner"})


def __getattr__(name: str) -> object:
    if name in _FROM_SIM:
        import llmsched.sim

        return getattr(llmsched.sim, name)
    raise AttributeError(f"module 'llmsched' has no attribute {name!r}")
