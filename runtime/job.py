"""The distributed job a training process belongs to (torchrun): its rank, and kdvfs's own gloo group.

torchrun gives every worker ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``.
:class:`JobGroup` is a gloo process group of kdvfs's own over the job's ranks, on the job's TCP store under
the key prefix ``kdvfs/``: independent of the script's process group (any backend, NCCL included; the
script may create and destroy its own at any time, or use none), usable from a background thread, and
carrying only a few floats per call on the CPU. A capture agrees through it when its measurement window
ends and takes the job's step time (the slowest rank's); the controller reduces each step's time and
match across ranks, so that every rank's windows, A/B arms and guard decisions are the job's.
Outside torchrun (``WORLD_SIZE`` unset or 1) there is no group and each reduction is the identity.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdvfs.common.files import split_suffix

TIMEOUT_S = 300.0
PREFIX = "kdvfs/"


@dataclass(frozen=True)
class Rank:
    """This process's place in the job: global ``rank``, ``local_rank`` on its node, ``world_size``."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Rank:
        """The rank torchrun gave this process (rank 0 of 1 outside torchrun)."""
        return cls(int(environ.get("RANK", "0")), int(environ.get("LOCAL_RANK", "0")),
                   int(environ.get("WORLD_SIZE", "1")))


def rank_path(path: str | Path, rank: int) -> Path:
    """Rank ``rank``'s file for ``path``: ``.rankR`` before the suffix (``step.trace.json`` ->
    ``step.rank1.trace.json``, ``run.jsonl`` -> ``run.rank1.jsonl``, ``tb`` -> ``tb.rank1``)."""
    path = Path(path)
    stem, suffix = split_suffix(path.name)
    return path.with_name(f"{stem}.rank{rank}{suffix}")


def path_rank(path: Path) -> int:
    """The rank a :func:`rank_path` names (``report.rank2.json`` -> 2, ``report.rank2.json.watchdog`` -> 2); 0
    for a path without one (a process outside torchrun)."""
    return int(path.name.split(".rank")[1].split(".")[0]) if ".rank" in path.name else 0


def write_rank_report(report_path: str | None, document: Mapping[str, Any]) -> None:
    """Write this training process's report to ``report_path`` as JSON (under torchrun each rank its own:
    :func:`rank_path`), the file :func:`rank_documents` reads; nothing without a path."""
    rank = Rank.from_environment()
    if report_path:
        path = rank_path(report_path, rank.rank) if rank.distributed else Path(report_path)
        path.write_text(json.dumps(document), encoding="utf-8")


def rank_documents(report: Path) -> list[dict[str, Any]]:
    """The reports the training processes wrote: ``report`` itself, or under torchrun each rank's
    (``report.rankR.json``, :func:`kdvfs.runtime.job.rank_path`), in rank order."""
    if report.is_file():
        return [json.loads(report.read_text(encoding="utf-8"))]
    ranked = {path_rank(path): path for path in report.parent.glob(f"{report.stem}.rank*{report.suffix}")}
    return [json.loads(ranked[rank].read_text(encoding="utf-8")) for rank in sorted(ranked)]


class JobGroup:
    """kdvfs's gloo group over the job's ranks (see the module docstring). Every rank must make the same
    calls in the same order."""

    def __init__(self, rank: Rank, environ: Mapping[str, str] = os.environ, timeout_s: float = TIMEOUT_S) -> None:
        import torch.distributed as dist

        self.rank = rank
        timeout = datetime.timedelta(seconds=timeout_s)
        agent_store = environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        store = dist.TCPStore(environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), rank.world_size,
                              is_master=not agent_store and rank.rank == 0, timeout=timeout, multi_tenant=True)
        self._group: Any = dist.ProcessGroupGloo(dist.PrefixStore(PREFIX, store), rank.rank, rank.world_size, timeout)

    def close(self) -> None:
        """Release the group and its store now, while the interpreter and the other ranks are still alive
        (idempotent): a gloo group left to interpreter shutdown can abort the process ("terminate called
        without an active exception")."""
        self._group = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> JobGroup | None:
        """The job's group under torchrun with more than one rank, else None."""
        rank = Rank.from_environment(environ)
        return cls(rank, environ) if rank.distributed else None

    def _reduce(self, values: Sequence[float], operation: str) -> list[float]:
        import torch
        import torch.distributed as dist

        if self._group is None:
            raise RuntimeError("the job group is closed")
        tensor = torch.tensor(list(values), dtype=torch.float64)
        options = dist.AllreduceOptions()
        options.reduceOp = getattr(dist.ReduceOp, operation)
        self._group.allreduce([tensor], options).wait()
        return [float(v) for v in tensor.tolist()]

    def max(self, values: Sequence[float]) -> list[float]:
        """Each value's maximum over the ranks."""
        return self._reduce(values, "MAX")

    def min(self, values: Sequence[float]) -> list[float]:
        """Each value's minimum over the ranks."""
        return self._reduce(values, "MIN")


@dataclass(frozen=True)
class JobStep:
    """One step as the job saw it: its time (the slowest rank's, s; None when a rank had none), whether every
    rank matched, the shortest open A/B window (s) and the job's time since its first step (the longest, s)."""

    duration_s: float | None
    matched: bool
    window_elapsed_s: float
    since_start_s: float


def job_step(group: JobGroup | None, step: JobStep) -> JobStep:
    """``step`` reduced over the job's ranks in one collective (itself without a group)."""
    if group is None:
        return step
    none, duration_s, mismatch, neg_elapsed_s, since_s = group.max([
        float(step.duration_s is None), -1.0 if step.duration_s is None else step.duration_s,
        float(not step.matched), -step.window_elapsed_s, step.since_start_s])
    return JobStep(None if none else duration_s, not mismatch, -neg_elapsed_s, since_s)
