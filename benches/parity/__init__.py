"""Step-by-step parity of llmsched with vLLM 0.33.0's own v1 scheduler: the tool.

- ``harness``: drives both schedulers with one deterministic model runner and engine loop,
  and compares every step;
- ``matrix``: the workloads (synthetic presets, Azure and Mooncake traces) and configs;
- ``plugin``: the same harness with vLLM's objects on both sides, every field compared
  (vLLM's scheduler against the plug-in ``llmsched.vllm``);
- ``fuzz``: random small cases beyond the matrix (``python -m benches.parity.fuzz``);
- ``report``: prints the table and writes ``docs/parity.md`` and ``docs/parity.json``
  (``python -m benches.parity.report``; ``make parity``).

The tests that assert it are ``tests/parity/`` (``make parity-test``).
"""
