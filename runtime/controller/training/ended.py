"""What ``kdvfs run`` reports for training processes that ended without writing their summary (``os.abort()``,
SIGKILL, a crash in native code, a torchrun rank killed): the error, whether each such GPU is back at its own
clock control, and what the run's log measured so far.

Whether a GPU is restored comes from its watchdog's outcome file (:mod:`kdvfs.runtime.device.watchdog`): a
process that never started its watchdog never changed a clock (True); a watchdog still watching after
``WATCHDOG_WAIT_S`` leaves it unknown (None). A process that leased its GPU through ``kdvfs daemon`` left a
lease file instead (``report*.daemon``, :func:`~kdvfs.runtime.controller.control.opening.daemon_lease_path`):
the daemon is asked, and it is True only once the daemon confirms that the dead process no longer holds the GPU
and no reset of it is owed; False when it still holds it after ``WATCHDOG_WAIT_S`` (a child of it may keep the
connection) or a reset is owed; None when no daemon answers. What was measured comes from the ``--log`` file,
when there is one: the steps its windows cover, their count, and the last live estimate of the saving and
slowdown.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

from kdvfs.runtime.controller.event_log import EventLogError, read_event_log
from kdvfs.runtime.controller.model.json_form import JsonFormError
from kdvfs.runtime.controller.model.run_summary import EndedRank, EndedSummary, JobSummary, Measured
from kdvfs.runtime.daemon.client import released
from kdvfs.runtime.device.watchdog import FAILED, RESTORED, STOPPED, WATCHING
from kdvfs.runtime.job import path_rank, rank_path

WATCHDOG_WAIT_S = 5.0
"""How long the parent waits for a dead process's watchdog to finish its reset (it polls every 0.1 s)."""
_POLL_S = 0.05


def watchdog_states(folder: Path) -> dict[int, str]:
    """Each rank's watchdog state, once every watchdog left ``watching`` or ``WATCHDOG_WAIT_S`` passed."""
    deadline = time.monotonic() + WATCHDOG_WAIT_S
    while True:
        states = {path_rank(p): p.read_text(encoding="utf-8").strip() for p in folder.glob("report*.watchdog")}
        if WATCHING not in states.values() or time.monotonic() > deadline:
            return states
        time.sleep(_POLL_S)


def daemon_released(folder: Path, skip: set[int]) -> dict[int, bool | None]:
    """Each rank's ``gpu_restored`` as the daemon confirms it, for the ranks that leased their GPU through it
    (but those in ``skip``, which reported their own)."""
    found: dict[int, bool | None] = {}
    for path in folder.glob("report*.daemon"):
        if path_rank(path) in skip:
            continue
        try:
            lease = json.loads(path.read_text(encoding="utf-8"))
            found[path_rank(path)] = released(str(lease["socket"]), int(lease["gpu"]), int(lease["pid"]),
                                              WATCHDOG_WAIT_S)
        except (OSError, ValueError, KeyError, TypeError):
            found[path_rank(path)] = None
    return found


def restored(state: str | None) -> bool | None:
    """A watchdog state as ``gpu_restored``: True, False, or None (unknown)."""
    if state is None or state in (STOPPED, RESTORED):
        return True
    return False if state == FAILED else None


def all_restored(values: list[bool | None]) -> bool | None:
    """Several ``gpu_restored`` as one: False when any is False, else None when any is unknown, else True."""
    return False if False in values else None if None in values else True


@dataclass(frozen=True)
class SoFar:
    """What a run's log measured: the last step its windows cover (None: none), their count, and the last live
    estimate (None: none)."""

    steps: int | None
    windows: int
    measured: Measured | None


def measured_so_far(log: str | None, ranks: list[int], distributed: bool) -> SoFar:
    """Steps, windows and the last live estimate in the run's log (rank ``ranks[0]``'s under torchrun)."""
    empty = SoFar(None, 0, None)
    if not log or not ranks:
        return empty
    path = rank_path(log, ranks[0]) if distributed else Path(log)
    try:
        records, _ = read_event_log(path)  # a record cut off by the kill is left out
    except EventLogError:
        return empty
    windows = [r for r in records if r.get("event") == "window"]
    estimates = [r["measured"] for r in records if r.get("event") in ("pair", "pair_energy")]
    try:
        last = Measured.from_json(estimates[-1]) if estimates else None
    except JsonFormError:
        last = None
    return SoFar(max((w["last_step"] for w in windows), default=None), len(windows), last)


def ended_summary(ending: str, missing: dict[int, bool | None], log: str | None, distributed: bool,
                  clock_control: str) -> EndedSummary:
    """The summary of a run none of whose processes wrote one; ``missing``: each rank's ``gpu_restored``."""
    so_far = measured_so_far(log, sorted(missing), distributed)
    return EndedSummary(f"{ending} before the controller wrote its summary", all_restored(list(missing.values())),
                        True, so_far.steps, so_far.windows, so_far.measured, _ended_ranks(missing), clock_control)


def _ended_ranks(missing: dict[int, bool | None]) -> list[EndedRank]:
    return [EndedRank(rank, value) for rank, value in sorted(missing.items())]


def with_missing_ranks(job: JobSummary, ending: str, missing: dict[int, bool | None]) -> JobSummary:
    """A job summary of the ranks that wrote one, marked with the ranks that did not."""
    if not missing:
        return job
    note = f"rank(s) {', '.join(map(str, sorted(missing)))} ended without a summary ({ending})"
    summary = replace(job.summary, error=f"{job.summary.error}; {note}" if job.summary.error else note,
                      gpu_restored=all_restored([job.summary.gpu_restored, *missing.values()]))
    return JobSummary(summary, [*job.ranks, *_ended_ranks(missing)], partial=True)
