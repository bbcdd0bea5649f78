"""Parity with vLLM 0.33.0's scheduler, asserted (the tool is ``benches/parity/``):

- ``test_parity``: every step of the parity matrix identical, llmsched against vLLM;
- ``test_plugin``: every field of every ``SchedulerOutput`` and ``EngineCoreOutputs`` equal,
  the plug-in against vLLM;
- ``test_plugin_api``: the plug-in's own API (refusals, pause states, clients, stats).

Skipped where vLLM is not importable; ``make parity-test`` runs them in the vLLM venv.
"""
