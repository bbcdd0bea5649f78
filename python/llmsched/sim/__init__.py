"""llmsched's simulator: a model runner without a model, the engine loop, workloads, and the
replay behind ``llmsched simulate``.

Every scheduling decision in a simulation is the real scheduler's (:class:`llmsched.Scheduler`);
only the model's tokens and the GPU's step times are simulated:

- :class:`SimulatedModelRunner` keeps what vLLM's GPU model runner keeps and asserts what it
  asserts, and samples reproducible tokens (``runner``);
- :class:`Engine` drives a scheduler and a runner as vLLM's ``EngineCore`` does, sync or async
  (``engine``);
- :class:`Workload` and its loaders: the Azure and Mooncake trace formats and synthetic
  presets fitted to them (``workload``);
- :func:`simulate` replays a workload in virtual time under a :class:`CostModel` and reports
  latencies, throughput and KV use (``simulate``); the replay runs in the core, and the
  tests hold it against :class:`Engine` and :class:`SimulatedModelRunner`;
- :func:`check_scheduler_output` checks one step from its arrays alone, for tests (``checks``).
"""

from llmsched.sim.checks import check_scheduler_output
from llmsched.sim.cost import CostModel
from llmsched.sim.engine import Engine, ModelRunner
from llmsched.sim.report import SimulationReport
from llmsched.sim.results import RequestSummary
from llmsched.sim.runner import SimulatedModelRunner
from llmsched.sim.simulate import simulate
from llmsched.sim.workload import RequestSpec, Workload, WorkloadError, load_workload, synthetic

__all__ = [
    "CostModel",
    "Engine",
    "ModelRunner",
    "RequestSpec",
    "RequestSummary",
    "SimulatedModelRunner",
    "SimulationReport",
    "Workload",
    "WorkloadError",
    "check_scheduler_output",
    "load_workload",
    "simulate",
    "synthetic",
]
