"""Instructions the scheduler's calls execute per request-step, counted by callgrind.

Wall-clock figures on a shared machine move by 2x from one hour to the next; instruction
counts do not. This runs a ``llmsched bench`` case through the Python API under
``valgrind --tool=callgrind``, counting only inside ``schedule()``, ``update_from_output()``
and ``update_draft_token_ids()`` (the binding and the core, nothing of the stand-in runner),
twice with a different number of steps: the difference, divided by the request-steps it
adds, leaves out the warm-up and the requests' admission.

    python benches/count_instructions.py decode-1024 spec-decode-k3 prefill-heavy

With ``--cold-mib N`` each call starts after writing N MiB of other memory (as ``llmsched
bench --cold-mib``), and callgrind's cache simulation, with a last-level cache smaller than
that (4 MiB), also counts the cache lines the calls read and write from memory.

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


def _child(case_name: str, steps: int, cold_mib: int) -> None:
    from llmsched.bench.step import CASES, Evictor, LlmschedStepper

    stepper = LlmschedStepper(CASES[case_name])
    for _ in range(WARMUP):
        stepper.step()
    request_steps = 0
    if cold_mib:
        evict = Evictor(cold_mib)
        stepper.between = evict
    for _ in range(steps):
        if cold_mib:
            evict()
        request_steps += stepper.step()[2]
    print(f"REQUEST_STEPS {request_steps}")


CACHE_SIM = ("--cache-sim=yes", "--LL=4194304,16,64")
"""callgrind's cache simulation, its last-level cache 4 MiB: smaller than ``--cold-mib``'s
working set, so what a call finds there is what it left itself."""


def _count(case_name: str, steps: int, cold_mib: int) -> tuple[list[int], int]:
    """(instructions [and memory lines read, written], request-steps) of a run with
    ``steps`` counted steps."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        *(CACHE_SIM if cold_mib else ()),
        *(
            f"--toggle-collect=*__pymethod_{method}__*"
            for method in ("schedule", "update_from_output", "update_draft_token_ids")
        ),
        sys.executable,
        __file__,
        "--child",
        case_name,
        str(steps),
        str(cold_mib),
    ]
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    collected = re.search(r"Collected : ([\d, ]+)", run.stderr)
    request_steps = re.search(r"REQUEST_STEPS (\d+)", run.stdout)
    if run.returncode != 0 or collected is None or request_steps is None:
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
        sys.exit(f"count_instructions: the callgrind run of {case_name} failed: {tail}")
    events = [int(e.replace(",", "")) for e in collected.group(1).split()]
    # Events: Ir, then with the cache simulation Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw.
    counts = events[:1] + (events[-2:] if cold_mib else [])
    return counts, int(request_steps.group(1))


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    from llmsched.bench.step import CASES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="+", choices=sorted(CASES), metavar="case")
    parser.add_argument("--steps", type=int, default=100, help="counted steps (default: 100)")
    parser.add_argument(
        "--cold-mib",
        type=int,
        default=0,
        metavar="N",
        help="write N MiB before each call; also count the lines read and written from memory",
    )
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps: must be at least 1, got {args.steps}")
    if args.cold_mib < 0:
        parser.error(f"--cold-mib: must be at least 0, got {args.cold_mib}")
    if shutil.which("valgrind") is None:
        sys.exit("count_instructions: valgrind is not installed (apt-get install valgrind)")
    for case_name in args.cases:
        few = _count(case_name, 10, args.cold_mib)
        many = _count(case_name, 10 + args.steps, args.cold_mib)
        per = [(m - f) / (many[1] - few[1]) for m, f in zip(many[0], few[0], strict=True)]
        line = f"{case_name}: {per[0]:,.0f} instructions per request-step"
        if args.cold_mib:
            read, written = per[1], per[2]
            line += f", {read + written:.1f} memory lines ({read:.1f} read, {written:.1f} written)"
        print(line)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        # valgrind, in the same process group, got the interrupt too and is gone.
        print("count_instructions: interrupted", file=sys.stderr)
        sys.exit(130)
