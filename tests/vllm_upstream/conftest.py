"""The substitution: vLLM 0.33.0's scheduler unit tests, run against ``llmsched.vllm``.

``run.py`` loads this module and hands :class:`UpstreamPlugin` to ``pytest.main`` as a
plugin object. The plugin

- makes the schedulers vLLM's test helpers instantiate llmsched's: for every test, the
  module-level names ``Scheduler`` and ``AsyncScheduler`` (and ``DiffusionScheduler`` and
  ``DiffusionAsyncScheduler``, which vLLM's diffusion tests pass as ``scheduler_cls``) in
  vLLM's ``tests/v1/core/utils.py``
  (``create_scheduler``), in ``test_scheduler.py`` (its priority scheduler factory, which
  other test files import, calls ``Scheduler(...)`` directly) and in the test module itself
  are monkeypatched to
  ``llmsched.vllm.Scheduler`` / ``llmsched.vllm.AsyncScheduler``. vLLM's files are not
  edited;
- gives vLLM a device type: with no GPU vLLM resolves to its unspecified platform, whose
  empty device type ``DeviceConfig`` refuses. The scheduler never touches a device, so the
  platform reports ``"cpu"`` and, as vLLM's CUDA and CPU platforms do, that it supports the
  hybrid KV-cache manager (the connector tests enable it explicitly). vLLM's CPU platform
  itself is not used: it turns async scheduling off;
- applies ``selection.py``: excluded tests are deselected (their reasons are kept for the
  summary), and a test of a selected file that ``selection.py`` does not classify is an
  error, so that the lists stay exhaustive when vLLM's tests change;
- records every included test's outcome for ``run.py``'s summary.

Nothing here imports vLLM at module level and no hook is defined at module level: when the
project's main test suite walks ``tests/`` and imports this file as a conftest, it is inert.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

#: vLLM's test helper modules whose factories build the scheduler under test: ``utils``'s
#: ``create_scheduler``, and ``test_scheduler``'s priority factory, which other test files
#: import.
HELPER_MODULES = (
    "tests.v1.core.utils",
    "tests.v1.core.test_scheduler",
    "tests.v1.kv_connector.unit.utils",
    "tests.v1.kv_connector.unit.offloading_connector.utils",
)
#: The names that may hold vLLM's scheduler classes in a vLLM test or helper module, and the
#: plug-in's class each becomes (llmsched's serve diffusion LLMs too: vLLM's diffusion
#: classes are its schedulers with a canvas per request and deferred reads).
SCHEDULER_NAMES = {
    "Scheduler": "Scheduler",
    "AsyncScheduler": "AsyncScheduler",
    "DiffusionScheduler": "Scheduler",
    "DiffusionAsyncScheduler": "AsyncScheduler",
}
#: The name of the connector tests' leak check, which reads vLLM's scheduler internals
#: (``_inflight_prefills``, ``_kv_fetch_counts``, the KV manager's groups); replaced by
#: :func:`assert_plugin_empty` wherever it is bound.
LEAK_CHECK_NAME = "assert_scheduler_empty"


def assert_plugin_empty(scheduler: Any) -> None:
    """vLLM's ``assert_scheduler_empty`` (the connector tests' "no leaks" check), made
    through what the plug-in shows and its core: no request known, queued, running, set
    aside (vLLM's ``deferred_waiting``), finished and unreported, with a load reported and
    not taken up, or holding blocks for a connector; no request in a KV-fetch stage; no
    encoder output cached; every block but the null block free with no holder; and the
    core's invariants hold."""
    core = scheduler.core
    assert len(scheduler.requests) == 0
    assert len(scheduler.waiting) == 0
    assert len(scheduler.kv_holding_waiting) == 0
    assert core.num_skipped_waiting == 0
    assert len(scheduler.running) == 0
    assert len(scheduler.finished_req_ids) == 0
    assert len(scheduler.finished_recving_kv_req_ids) == 0
    assert core.num_held_kv_requests == 0
    if scheduler._kv_connector is not None:
        assert not any(scheduler._kv_connector.fetch_stage_counts().values())
    assert core.encoder_cache_state()[2] == 0
    kv = scheduler.kv_cache_manager
    for group in kv.coordinator.single_type_managers:
        assert len(group.req_to_blocks) == 0
        assert len(group.num_cached_block) == 0
    assert kv.block_pool.free_block_queue.num_free_blocks == kv.block_pool.num_gpu_blocks - 1
    assert all(block.ref_cnt == 0 for block in kv.block_pool.blocks)
    core.check_invariants()


def selection_key(nodeid: str) -> tuple[str, str]:
    """``(function key, parametrized key)`` of a node id: ``file::name`` and
    ``file::name[params]`` (the same when the test is not parametrized)."""
    base = nodeid.split("[", 1)[0]
    return base, nodeid


@dataclass
class Outcomes:
    """What happened to each test, by node id (filled during the run)."""

    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    excluded: dict[str, str] = field(default_factory=dict)
    unclassified: list[str] = field(default_factory=list)
    no_scheduler: list[str] = field(default_factory=list)
    """Tests that ran without building llmsched's scheduler (an included one fails)."""


class UpstreamPlugin:
    """The pytest plugin object: the class substitution, the selection, the outcomes.

    ``included`` and ``excluded`` are keyed by ``file::name`` (every parametrization) or
    ``file::name[params]`` (one); the more specific key wins. With ``run_all`` every
    collected test runs (for investigating excluded tests) and nothing is deselected.
    """

    def __init__(
        self,
        included: frozenset[str],
        excluded: Mapping[str, str],
        run_all: bool = False,
    ) -> None:
        self.included = included
        self.excluded = excluded
        self.run_all = run_all
        self.outcomes = Outcomes()

    # -- environment -------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        """Register vLLM's markers; give the unspecified platform a device type and hybrid
        KV-cache support."""
        config.addinivalue_line("markers", "cpu_test: vLLM's marker for CPU-only tests")
        config.addinivalue_line("markers", "slow_test: vLLM's marker for slow tests")
        config.addinivalue_line("markers", "skip_global_cleanup: vLLM's marker (no effect here)")
        from vllm.platforms import current_platform

        if not current_platform.device_type:
            current_platform.device_type = "cpu"
        current_platform.support_hybrid_kv_cache = lambda: True  # type: ignore[method-assign]

    # -- selection ---------------------------------------------------------------------

    def _classify(self, nodeid: str) -> tuple[str, str | None]:
        """``("included" | "excluded" | "unclassified", reason)`` of one test."""
        base, full = selection_key(nodeid)
        for key in (full, base):
            if key in self.excluded:
                return "excluded", self.excluded[key]
            if key in self.included:
                return "included", None
        return "unclassified", None

    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """Deselect the excluded tests; fail the unclassified ones at setup."""
        keep: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        for item in items:
            kind, reason = self._classify(item.nodeid)
            if kind == "excluded" and not self.run_all:
                self.outcomes.excluded[item.nodeid] = reason or ""
                dropped.append(item)
                continue
            if kind == "unclassified" and not self.run_all:
                self.outcomes.unclassified.append(item.nodeid)
            keep.append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Fail a test that ``selection.py`` neither includes nor excludes."""
        if item.nodeid in self.outcomes.unclassified:
            pytest.fail(
                f"{item.nodeid} is not classified in tests/vllm_upstream/selection.py",
                pytrace=False,
            )

    # -- the substitution --------------------------------------------------------------

    @pytest.fixture(autouse=True)
    def _llmsched_scheduler_classes(
        self, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
    ) -> Iterator[None]:
        """Point vLLM's test helpers and the test module at llmsched's scheduler classes, and
        count the schedulers the test builds: a test that builds none did not test the
        plug-in, and ``selection.py`` must exclude it."""
        import llmsched.vllm

        modules = [importlib.import_module(name) for name in HELPER_MODULES]
        if request.node.module is not None:
            modules.append(request.node.module)
        for module in modules:
            for name, plugin_class in SCHEDULER_NAMES.items():
                if hasattr(module, name):
                    monkeypatch.setattr(module, name, getattr(llmsched.vllm, plugin_class))
            if hasattr(module, LEAK_CHECK_NAME):
                monkeypatch.setattr(module, LEAK_CHECK_NAME, assert_plugin_empty)
        built: list[object] = []
        init = llmsched.vllm.Scheduler.__init__

        def counting_init(scheduler: object, *args: object, **kwargs: object) -> None:
            built.append(scheduler)
            init(scheduler, *args, **kwargs)

        monkeypatch.setattr(llmsched.vllm.Scheduler, "__init__", counting_init)
        yield
        if not built and self._classify(request.node.nodeid)[0] != "excluded":
            self.outcomes.no_scheduler.append(request.node.nodeid)
            if not self.run_all:
                pytest.fail(
                    f"{request.node.nodeid} never built llmsched.vllm's scheduler: "
                    "tests/vllm_upstream/selection.py must exclude it",
                    pytrace=False,
                )

    # -- outcomes ----------------------------------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Record each test's outcome once (a failing setup or teardown is a failure)."""
        out = self.outcomes
        if report.failed:
            if report.nodeid not in out.failed:
                out.failed.append(report.nodeid)
            if report.nodeid in out.passed:
                out.passed.remove(report.nodeid)
        elif report.skipped and report.when in ("setup", "call"):
            out.skipped.append(report.nodeid)
        elif report.passed and report.when == "call" and report.nodeid not in out.failed:
            out.passed.append(report.nodeid)
