"""The substitution: vLLM 0.33.0's scheduler unit tests, run against ``llmsched.vllm``.

``run.py`` loads this module and hands :class:`UpstreamPlugin` to ``pytest.main`` as a
plugin object. The plugin

- makes the schedulers vLLM's test helpers instantiate llmsched's: for every test, the
  module-level names ``Scheduler`` and ``AsyncScheduler`` in vLLM's ``tests/v1/core/utils.py``
  (``create_scheduler``), in ``test_scheduler.py`` (its priority scheduler factory, which
  other test files import, calls ``Scheduler(...)`` directly) and in the test module itself
  are monkeypatched to
  ``llmsched.vllm.Scheduler`` / ``llmsched.vllm.AsyncScheduler``. vLLM's files are not
  edited; an explicit ``scheduler_cls=`` argument is left alone;
- gives vLLM a device type: with no GPU vLLM resolves to its unspecified platform, whose
  empty device type ``DeviceConfig`` refuses. The scheduler never touches a device, so the
  platform reports ``"cpu"`` (vLLM's CPU platform is not used: it turns async scheduling
  off);
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

import pytest

#: vLLM's test helper modules whose factories build the scheduler under test: ``utils``'s
#: ``create_scheduler``, and ``test_scheduler``'s priority factory, which other test files
#: import.
HELPER_MODULES = ("tests.v1.core.utils", "tests.v1.core.test_scheduler")
#: The names that may hold vLLM's scheduler classes in a vLLM test or helper module.
SCHEDULER_NAMES = ("Scheduler", "AsyncScheduler")


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
        """Register vLLM's markers and give the unspecified platform a device type."""
        config.addinivalue_line("markers", "cpu_test: vLLM's marker for CPU-only tests")
        config.addinivalue_line("markers", "slow_test: vLLM's marker for slow tests")
        config.addinivalue_line("markers", "skip_global_cleanup: vLLM's marker (no effect here)")
        from vllm.platforms import current_platform

        if not current_platform.device_type:
            current_platform.device_type = "cpu"

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
        """Point vLLM's test helpers and the test module at llmsched's scheduler classes."""
        import llmsched.vllm

        replacement = {
            "Scheduler": llmsched.vllm.Scheduler,
            "AsyncScheduler": llmsched.vllm.AsyncScheduler,
        }
        modules = [importlib.import_module(name) for name in HELPER_MODULES]
        if request.node.module is not None:
            modules.append(request.node.module)
        for module in modules:
            for name in SCHEDULER_NAMES:
                if hasattr(module, name):
                    monkeypatch.setattr(module, name, replacement[name])
        yield

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
