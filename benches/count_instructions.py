"""Instructions the scheduler's calls execute per request-step, counted by callgrind.

Wall-clock figures on a shared machine move by 2x from one hour to the next; instruction
counts do not. This runs a ``llmsched bench`` case through the Python API under
``valgrind --tool=callgrind``, counting only inside ``schedule()``, ``update_from_output()``
and ``update_draft_token_ids()`` (the binding and the core, nothing of the stand-in runner),
twice with a different number of steps: the difference, divided by the request-steps it
adds, leaves out the warm-up and the requests' admission.

    python benches/count_instructions.py decode-1024 spec-decode-k3 prefill-heavy

Needs valgrind and a release build of llmsched (an editable debug build counts its checks).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys

WARMUP = 60
"""Untimed steps before counting: the case's steady state (as ``llmsched bench``)."""


def _child(case_name: str, steps: int) -> None:
    from llmsched.bench import CASES, LlmschedStepper

    stepper = LlmschedStepper(CASES[case_name])
    for _ in range(WARMUP):
        stepper.step()
    request_steps = sum(stepper.step()[2] for _ in range(steps))
    print(f"REQUEST_STEPS {request_steps}")


def _count(case_name: str, steps: int) -> tuple[int, int]:
    """(instructions, request-steps) of a run with ``steps`` counted steps."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        *(
            f"--toggle-collect=*__pymethod_{method}__*"
            for method in ("schedule", "update_from_output", "update_draft_token_ids")
        ),
        sys.executable,
        __file__,
        "--child",
        case_name,
        str(steps),
    ]
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    collected = re.search(r"Collected : ([\d,]+)", run.stderr)
    request_steps = re.search(r"REQUEST_STEPS (\d+)", run.stdout)
    if run.returncode != 0 or collected is None or request_steps is None:
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
        sys.exit(f"count_instructions: the callgrind run of {case_name} failed: {tail}")
    return int(collected.group(1).replace(",", "")), int(request_steps.group(1))


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]))
        return
    from llmsched.bench import CASES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="+", choices=sorted(CASES), metavar="case")
    parser.add_argument("--steps", type=int, default=100, help="counted steps (default: 100)")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps: must be at least 1, got {args.steps}")
    if shutil.which("valgrind") is None:
        sys.exit("count_instructions: valgrind is not installed (apt-get install valgrind)")
    for case_name in args.cases:
        few = _count(case_name, 10)
        many = _count(case_name, 10 + args.steps)
        per_request_step = (many[0] - few[0]) / (many[1] - few[1])
        print(f"{case_name}: {per_request_step:,.0f} instructions per request-step")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        # valgrind, in the same process group, got the interrupt too and is gone.
        print("count_instructions: interrupted", file=sys.stderr)
        sys.exit(130)
