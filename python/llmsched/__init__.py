"""llmsched: the request scheduler of an LLM serving engine.

vLLM v1's scheduling decisions, made in Rust: ``Scheduler.schedule()`` says
which requests run this step and how many tokens each, as numpy arrays;
``update_from_output()`` applies what the model runner sampled. Every
scheduled request keeps ``C + n + s <= max_model_len``.
"""

from collections.abc import Sequence as _Sequence

from llmsched._core import (
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
from llmsched.engine import Engine, RequestSummary
from llmsched.outputs import ModelRunnerOutput
from llmsched.runner import SimulatedModelRunner
from llmsched.status import RequestStatus

__all__ = [
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
