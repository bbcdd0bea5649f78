"""Step-by-step parity of llmsched with vLLM 0.33.0's own v1 scheduler.

- ``harness``: drives both schedulers with one deterministic model runner and engine loop,
  and compares every step;
- ``matrix``: the workloads (synthetic presets, Azure and Mooncake traces) and configs;
- ``fuzz``: random small cases beyond the matrix (``python -m tests.parity.fuzz``);
- ``test_parity``: asserts every step identical (skipped where vLLM is not importable;
  ``make parity-test``);
- ``report``: prints the table and writes ``docs/parity.md`` and ``docs/parity.json``
  (``python -m tests.parity.report``; ``make parity``).
"""
