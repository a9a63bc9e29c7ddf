"""Run a training script and record the host time of each of its optimizer steps, nothing else.

    python benchmarks/h200/step_clock.py OUT.json SCRIPT [ARGS...]

A global optimizer post-step hook appends ``time.perf_counter()`` (no GPU sync: in a steady training loop the
host's step interval is the step's time) and the process's CPU time (all its threads); at exit they go to
OUT.json as ``{"step_s": [...], "cpu_s": [...]}``: the intervals between consecutive steps, and the process's
CPU time at each step. ``benchmarks/h200/overhead.py`` runs the same
script through it with and without ``kdvfs run --dry-run``, so both arms are timed the same way.
"""

from __future__ import annotations

import atexit
import itertools
import json
import sys
import time
from pathlib import Path


def main() -> None:
    out, target = Path(sys.argv[1]), sys.argv[2:]
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from kdvfs.runtime.child import run_target

    stamps: list[float] = []
    cpu_s: list[float] = []

    def stamp(optimizer: object, args: object, kwargs: object) -> None:
        stamps.append(time.perf_counter())
        cpu_s.append(time.process_time())

    register_optimizer_step_post_hook(stamp)

    def write() -> None:
        out.write_text(json.dumps({"step_s": [b - a for a, b in itertools.pairwise(stamps)], "cpu_s": cpu_s}))

    atexit.register(write)
    run_target(target)


if __name__ == "__main__":
    main()
