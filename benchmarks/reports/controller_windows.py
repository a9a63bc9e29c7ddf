"""How a controller benchmark process (``benchmarks/h200/controller.py child``) lays out its steps, shared by the
benchmark that runs it and the report that reads it (``reports/controller.py``, ``reports/controller_timing.py``).

A process trains for ``WARMUP_STEPS`` steps untouched, then runs windows of steps with and without the controller
in the order ``ORDER`` (ABBA...; each arm's block of them in turn, ``controller_arms.arm_order``), then, where it
profiles, runs the controller ``SETTLE_STEPS`` steps before the profiled steps. The latency-optimal plans it applies
by default live in ``benchmarks/data/controller_h200`` (``benchmarks/h200/controller.py plans`` writes them).
"""

from __future__ import annotations

from pathlib import Path

from kdvfs.common.paths import REPO_ROOT

ORDER = (True, False, False, True, True, False, False, True)
"""Each window with (True) or without the controller: four ABBA pairs."""
WARMUP_STEPS = 10
SETTLE_STEPS = 10
PLANS = REPO_ROOT / "benchmarks" / "data" / "controller_h200"


def plan_path(label: str, folder: Path = PLANS) -> Path:
    """The latency-optimal plan of workload ``label`` in ``folder``."""
    return folder / f"plan-{label}.json"


def parse_options(options: list[str]) -> dict[str, bool | float]:
    """Controller options of a variant or arm, ``NAME=true|false|NUMBER`` (e.g. ``online=false``: the policy
    replayed; ``online_warm_up=false``: no rehearsal before a decision point)."""
    parsed: dict[str, bool | float] = {}
    for option in options:
        name, _, value = option.partition("=")
        if value in ("true", "false"):
            parsed[name] = value == "true"
            continue
        try:
            parsed[name] = int(value) if value.isdigit() else float(value)
        except ValueError:
            raise SystemExit(f"--option {option!r}: expected NAME=true, NAME=false or NAME=NUMBER") from None
    return parsed
