"""What the controller costs the host: the CPU time of its threads and hooks, per step and as a share of the
step's time, and how often its thread woke.

The controller's thread (the issuer) and the energy counter's thread each report their own CPU time
(``time.thread_time`` when they stop); the hooks that mark steps and anchors run on the training threads, each
counting its own thread's CPU (``time.thread_time``: not the time it waits for the interpreter lock; the anchors' on
one in ``CPU_SAMPLE_ANCHORS``). A controller in a process of its own
(:mod:`~kdvfs.runtime.controller.training.own_process`) runs in the training process only the hooks, the event
poller (native, without the interpreter lock) and, in a run whose steps vary, the shape server. Their sum over the
steps the controller saw, against the mean time between step ends, is the controller's host cost; the thread's
wakes (sleeps on its clock and looks at the GPU timeline) say whether it slept until it had work."""

from __future__ import annotations

from kdvfs.runtime.controller.model.run_summary import HostCost


def host_cost(thread_s: float, energy_s: float | None, hooks_s: float | None, steps: int,
              step_interval_s: float | None, wakes: int, server_s: float | None = None,
              timeline_wakes: int | None = None, own_process: bool = False) -> HostCost:
    """The summary's ``host_cost``: CPU (s) of the controller's thread, the energy thread (None: no energy
    measurement), the hooks (None: not recorded) and the training process's threads that serve the controller
    (``server_s``: the event poller and the shape server; None: none), in all and per step, the per-step total's
    share of the mean step time (fraction; None before two step ends), for a controller in a process of its own
    (``own_process``) the training process's own part of it (hooks and server; None in process, where every part
    runs there), and the thread's wakes in all and per step (of them ``timeline_wakes``, the GPU timeline's looks;
    None: a timeline that makes none)."""
    total_s = thread_s + (energy_s or 0.0) + (hooks_s or 0.0) + (server_s or 0.0)
    training_s = server_s + (hooks_s or 0.0) if own_process and server_s is not None else None
    per_step_s = total_s / steps if steps else None
    return HostCost(
        thread_s=thread_s, energy_thread_s=energy_s, hooks_s=hooks_s, total_s=total_s, per_step_s=per_step_s,
        thread_per_step_s=thread_s / steps if steps else None,
        step_share=None if per_step_s is None or not step_interval_s else per_step_s / step_interval_s,
        thread_step_share=None if not steps or not step_interval_s else thread_s / steps / step_interval_s,
        wakes=wakes, wakes_per_step=wakes / steps if steps else None, server_s=server_s, timeline_wakes=timeline_wakes,
        training_step_share=None if training_s is None or not steps or not step_interval_s
        else training_s / steps / step_interval_s)
