"""Opening the GPU for the controller, with every check made before a clock changes.

Owns: the device (the one given; else GPU ``gpu_index``, by default this rank's, through ``kdvfs daemon`` when
``daemon`` or ``KDVFS_DAEMON`` names its socket, else NVML), the plan or policy loaded for it and the step's
expected timeline, the checks (the profile is this GPU's, each clock of the schedule is supported, this process
may lock clocks unless ``dry_run``), the GPU's lease and watchdog of a run that changes clocks through NVML, and
the daemon lease file ``kdvfs run`` reads should this process die.

Failure modes: a failed check raises its ``KdvfsError`` before any clock changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from kdvfs.runtime.controller.config import ControllerConfig
from kdvfs.runtime.controller.decisions.actuator import parse_clocks
from kdvfs.runtime.controller.model.plan import Plan, load_plan
from kdvfs.runtime.controller.model.step_plan import StepPlan
from kdvfs.runtime.daemon.client import NVML_CONTROL, DaemonDevice, daemon_socket
from kdvfs.runtime.device.interface import Device, check_clocks_mhz
from kdvfs.runtime.device.lease import GpuLease
from kdvfs.runtime.device.nvml_device import NvmlDevice, import_nvml, require_clock_permission
from kdvfs.runtime.device.visible import rank_gpu_index
from kdvfs.runtime.device.watchdog import spawn_watchdog, watchdog_outcome_path
from kdvfs.runtime.job import Rank, rank_path

RUN_NEEDS = "the clock controller locks GPU clocks"
RUN_FIX = ("run it as root, or through a kdvfs daemon (--daemon SOCKET or KDVFS_DAEMON; docs/daemon.md), or add "
           "--dry-run to see what it would do without changing clocks")


@dataclass(frozen=True)
class Opened:
    """What the controller opened and checked: its config (this rank's, with the GPU index and daemon socket
    found), the device, whether NVML is the fake one (tests), the plan and the step's expected timeline."""

    config: ControllerConfig
    device: Device
    fake_nvml: bool
    plan: Plan
    step_plan: StepPlan


def check_device(plan: Plan, device: Device) -> None:
    """Raise unless ``device`` supports each clock of ``plan``'s schedule (and of its online policy's grid)."""
    supported = device.supported_clocks_mhz()
    labels = {plan.problem.costs.label(int(a)) for a in plan.schedule.actions}
    for label in sorted(labels | set(plan.online.labels if plan.online is not None else ())):
        core_mhz, mem_mhz = parse_clocks(label)
        check_clocks_mhz(supported, core_mhz, mem_mhz, f"GPU {device.index} ({device.name})")


def clock_control_of(device: Device) -> str:
    """How ``device`` changes clocks, as summaries report it: ``nvml`` (this process, as root), ``daemon:PATH``
    (through the daemon at PATH), or ``device:CLASS`` for another device handed to the controller (tests)."""
    if isinstance(device, DaemonDevice):
        return device.clock_control
    return NVML_CONTROL if isinstance(device, NvmlDevice) else f"device:{type(device).__name__}"


def connection_error(device: Device) -> str | None:
    """The error that ended a daemon connection (a restore confirmed by a restarted daemon, say), or None."""
    return str(device.connection_error) if isinstance(device, DaemonDevice) and device.connection_error else None


def open_device(config: ControllerConfig, stack: contextlib.ExitStack) -> tuple[Device, ControllerConfig, bool]:
    """GPU ``gpu_index`` (default: this rank's, CUDA device ``LOCAL_RANK``) through the daemon when ``daemon``
    (else ``KDVFS_DAEMON``) names its socket, else through NVML, closed by ``stack``; with ``config`` holding the
    index and socket found, and whether the NVML module is the fake one."""
    nvml = import_nvml(config.nvml_module)
    fake_nvml = bool(getattr(nvml, "FAKE_NVML", False))  # kdvfs.runtime.testing.nvml
    index = rank_gpu_index(nvml) if config.gpu_index is None else config.gpu_index
    config = replace(config, gpu_index=index, daemon=daemon_socket(config.daemon))
    energy = config.measurement.energy
    if config.daemon is not None:
        return stack.enter_context(DaemonDevice(config.daemon, index, nvml, check_energy=energy)), config, fake_nvml
    return stack.enter_context(NvmlDevice(index, nvml, check_energy=energy)), config, fake_nvml


def open_checked(config: ControllerConfig, rank: Rank, device: Device | None, stack: contextlib.ExitStack) -> Opened:
    """Open the device (``device`` when given), load the plan for it and make every check (see the module
    docstring); what is opened is closed by ``stack``."""
    fake_nvml = False
    if device is None:
        device, config, fake_nvml = open_device(config, stack)
    plan = load_plan(config, device.name)
    check_device(plan, device)
    if not config.dry_run:
        require_clock_permission(needs=RUN_NEEDS, fix=RUN_FIX, allowed=device.has_clock_permission())
        if isinstance(device, DaemonDevice) and config.report_path:  # for `kdvfs run`, should this process die
            write_daemon_lease(report_path(config, rank), device.socket_path, device.index)
    config.measurement.check_window(plan.problem.latency_s)
    return Opened(config, device, fake_nvml, plan, StepPlan.build(plan.problem, plan.schedule, config.dry_run))


def lease_and_watch(opened: Opened, rank: Rank, stack: contextlib.ExitStack) -> subprocess.Popen[bytes] | None:
    """Take the GPU's lease (:mod:`kdvfs.runtime.device.lease`) of a run that changes clocks through NVML and,
    with ``watchdog``, start its watchdog sharing the lease; the watchdog process (None: none started). The lease
    is released by ``stack``; stopping the watchdog is the caller's (before the lease goes)."""
    config, device = opened.config, opened.device
    if config.dry_run or not isinstance(device, NvmlDevice):
        return None
    lease = stack.enter_context(GpuLease(device.uuid(), device.index))
    if not config.watchdog:
        return None
    outcome = str(watchdog_outcome_path(report_path(config, rank))) if config.report_path else None
    return spawn_watchdog(device.index, config.nvml_module, outcome, () if lease.fd is None else (lease.fd,))


def report_path(config: ControllerConfig, rank: Rank) -> Path:
    """This process's report for ``kdvfs run`` (``report_path`` is set): its rank's in a torchrun job."""
    assert config.report_path is not None
    return rank_path(config.report_path, rank.rank) if rank.distributed else Path(config.report_path)


def daemon_lease_path(report: Path) -> Path:
    """The file in which the training process whose report is ``report`` records the GPU it leased through the
    daemon: ``{"socket", "gpu", "pid"}``."""
    return report.with_name(report.name + ".daemon")


def write_daemon_lease(report: Path, socket_path: str, gpu: int) -> None:
    """Record (:func:`daemon_lease_path`) that this process leased GPU ``gpu`` through the daemon at ``socket_path``."""
    daemon_lease_path(report).write_text(json.dumps({"socket": socket_path, "gpu": gpu, "pid": os.getpid()}),
                                         encoding="utf-8")
