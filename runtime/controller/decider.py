"""The online policy's decisions in a process of their own, off the training process's interpreter lock.

A decision (the observation and the policy, ~120 us of CPU on an H200 host) runs about fifty times per
controlled step. On the controller's thread it holds the training process's interpreter lock all that time,
which a training loop bound by its own Python (a Hugging Face ``Trainer`` step) waits for. Measured there:
the controller thread's decision CPU went from 5.7 to 1.5 ms per step; the step-time overhead of the two
did not differ beyond the Trainer's scatter between windows. :class:`DeciderProcess` runs the same
:class:`~kdvfs.agents.learned.online.OnlinePolicy` in ``python -m kdvfs.runtime.controller.decider``: the
controller's thread sends each live state down a pipe as one fixed-size record and waits for the answer
with the lock released (``os.read``), so the training thread runs meanwhile. Decisions are the in-process
ones, bit for bit (the same code on the same inputs; tested).

A core left idle between decision points (~6 ms apart) loses its caches: on the H200 host a decision
after 5 ms asleep took 218 us, after 5 ms of polling 53 us (``benchmarks/results/controller_costs.md``).
With a warm lead (``decider_warm_ms``), the controller's thread says after each decision point when it
expects the next (:meth:`DeciderProcess.expect`); the child sleeps until that lead before it, runs a
throwaway decision at the last state (:meth:`~kdvfs.agents.learned.online.OnlinePolicy.warm`), and polls
the pipe without sleeping until the request comes (or ``SPIN_AFTER_S`` after it was expected). Its polling
time is reported per decision (``spin_us``): CPU the host spends for the shorter decision.

The controller's thread writes its requests without letting go of the interpreter lock
(:func:`write_holding_lock`; ``os.write`` lets go of it around the system call): a training thread waiting
for the lock would take it there, and the controller's thread would then wait for it back (up to the
switch interval) and make the training thread give it up again, two hand-overs for a write of ~2 us. It
lets go only where it waits for the answer. Its end of the pipe is non-blocking, so a child that stopped
reading makes the write fail (``DeciderError``) instead of blocking with the lock held.

Lifecycle: started first when the controller opens (it imports its modules while the controller builds the
plan), given the policy once the plan is built, and waited for until it has built its own (a few seconds,
once); stopped when the controller closes, or when opening fails; it ends by itself when the pipe closes
(the training process ended or was killed) and ignores Ctrl-C (the trainer's handling decides). If it
dies, the next decision raises :class:`DeciderError`: the controller's thread stops and the GPU goes back
to auto, as for any error.
"""

from __future__ import annotations

import contextlib
import copyreg
import ctypes
import functools
import io
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
import types
from collections.abc import Callable
from typing import IO, Any

from kdvfs.agents.common.problem import Problem
from kdvfs.agents.learned.frozen import FrozenPolicy
from kdvfs.agents.learned.online import OnlineDecision, OnlinePolicy
from kdvfs.envs.common.errors import KdvfsError
from kdvfs.envs.env.live import LiveState

BEGIN, DECIDE, LOOK_AHEAD, EXPECT = 0, 1, 2, 3
NO_CHANGE_KNOWN = -1
"""``next_change`` on the wire when it is None."""
START_TIMEOUT_S = 60.0
SPIN_AFTER_S = 1e-3
"""How long after an expected request the child stops polling for it and sleeps."""
STOP_TIMEOUT_S = 2.0
SIZE = struct.Struct("<Q")
REQUEST = struct.Struct("<Bdiiiddddd")
"""kind, budget (BEGIN), now_s (DECIDE), evaluations (LOOK_AHEAD) or the seconds until the next request
(EXPECT, not answered), then the LiveState's fields in order."""
LOOKED_AHEAD = struct.Struct("<di")
"""The answer to LOOK_AHEAD: when the policy runs next (s), the evaluations skipped."""


_LIBC = ctypes.PyDLL(None, use_errno=True)
"""The C library, through which calls keep the interpreter lock (``PyDLL``)."""
_LIBC.write.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
_LIBC.write.restype = ctypes.c_ssize_t


class DeciderError(KdvfsError):
    """The online decision process ended or answered nothing."""


def write_holding_lock(fd: int, data: bytes) -> None:
    """Write ``data`` to the pipe ``fd`` in one system call, keeping the interpreter lock (see the module
    docstring). ``data`` must fit the pipe's atomic size (``select.PIPE_BUF``), so the write is whole or fails;
    OSError as ``os.write`` would raise (``BlockingIOError`` where a non-blocking pipe is full)."""
    assert len(data) <= select.PIPE_BUF, "a write holding the lock must be one atomic pipe write"
    if _LIBC.write(fd, data, len(data)) != len(data):
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


def _response(actions: int) -> struct.Struct:
    """pair, evaluated, the action's ``actions`` parts, budget_used, affordable_pct, next_change, policy_due_s,
    the decision's time in the child (us) and how long the child polled for it without sleeping (us)."""
    return struct.Struct(f"<i?{actions}iddiddd")


def read_only(mapping: dict[Any, Any]) -> types.MappingProxyType[Any, Any]:
    """A read-only view of ``mapping`` (how the child process unpickles one)."""
    return types.MappingProxyType(mapping)


def _pickled(value: Any) -> bytes:
    """``value`` pickled, read-only mappings (the profiles' and traces') as such."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = {**copyreg.dispatch_table,
                              types.MappingProxyType: lambda mapping: (read_only, (dict(mapping),))}
    pickler.dump(value)
    return buffer.getvalue()


def _read_exact(fd: int, size: int) -> bytes | None:
    """``size`` bytes from ``fd``, None at its end."""
    chunks, left = [], size
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class DeciderProcess:
    """:meth:`OnlinePolicy.begin` and :meth:`OnlinePolicy.decide` of a policy on a problem, in a child
    process (see the module docstring). Not for concurrent use (one controller thread).

    Constructing it starts the child, which imports its modules (seconds) while the controller builds its
    own plan; :meth:`load` then gives it the policy and waits until it has built its own (:meth:`started`:
    both at once).

    Args:
        warm_s: the warm lead (s; 0: the child sleeps until each request; see the module docstring).

    Attributes:
        compute_us: each :meth:`decide`'s time in the child (wall us, from the request read to the answer
            made): the rest of a decision's wall time is the pipe, the wake-ups and the interpreter lock.
        spin_us: how long the child polled for each :meth:`decide` without sleeping (us; 0 where it slept).
    """

    def __init__(self, warm_s: float = 0.0) -> None:
        environment = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self._process = subprocess.Popen([sys.executable, "-m", "kdvfs.runtime.controller.decider"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=environment)
        assert self._process.stdin is not None and self._process.stdout is not None
        self._to, self._from = self._process.stdin.fileno(), self._process.stdout.fileno()
        self._response, self.warm_s = _response(0), warm_s
        self.compute_us: list[float] = []
        self.spin_us: list[float] = []

    @classmethod
    def started(cls, policy: FrozenPolicy, problem: Problem, warm_s: float = 0.0) -> DeciderProcess:
        """A child process deciding for ``policy`` on ``problem`` with warm lead ``warm_s``, ready."""
        decider = cls(warm_s)
        decider.load(policy, problem)
        return decider

    def load(self, policy: FrozenPolicy, problem: Problem) -> None:
        """Give the child ``policy`` and ``problem`` and wait until it has built its policy (DeciderError if it
        does not within ``START_TIMEOUT_S``; the child is then ended)."""
        assert self._process.stdin is not None
        self._response = _response(len(policy.nvec))
        payload = _pickled((policy, problem, self.warm_s))
        try:
            os.write(self._to, SIZE.pack(len(payload)))
            self._process.stdin.write(payload)
            self._process.stdin.flush()
        except OSError as error:
            self.close()
            raise DeciderError(f"the online decision process did not start ({error})") from None
        started = select.select([self._from], [], [], START_TIMEOUT_S)[0]
        if not started or _read_exact(self._from, 1) != b"R":
            self.close()
            raise DeciderError(f"the online decision process did not start within {START_TIMEOUT_S:.0f} s "
                               f"(exit code {self._process.poll()})")
        os.set_blocking(self._to, False)  # from here requests are written holding the interpreter lock

    def begin(self, budget: float) -> int:
        """:meth:`OnlinePolicy.begin` in the child process."""
        return int(self._ask(REQUEST.pack(BEGIN, budget, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0))[0])

    def decide(self, state: LiveState, now_s: float) -> OnlineDecision:
        """:meth:`OnlinePolicy.decide` in the child process."""
        fields = self._ask(REQUEST.pack(DECIDE, now_s, state.kernel, state.in_effect, state.pending,
                                        state.pending_age_s, state.elapsed_s, state.auto_elapsed_s,
                                        state.last_latency_ratio, state.auto_drift_pct))
        pair, evaluated, *action, budget_used, affordable_pct, next_change, policy_due_s, compute_us, spin_us = fields
        self.compute_us.append(compute_us)
        self.spin_us.append(spin_us)
        return OnlineDecision(pair, evaluated, tuple(action), budget_used, affordable_pct,
                              None if next_change == NO_CHANGE_KNOWN else next_change, policy_due_s)

    def look_ahead(self, evaluations: int) -> tuple[float, int]:
        """:meth:`OnlinePolicy.look_ahead` in the child process."""
        due_s, skipped = self._ask(REQUEST.pack(LOOK_AHEAD, evaluations, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0),
                                   LOOKED_AHEAD)
        return float(due_s), int(skipped)

    def expect(self, in_s: float) -> None:
        """Say that the next request comes in ``in_s`` seconds (nothing is sent without a warm lead)."""
        if self.warm_s > 0:
            with contextlib.suppress(OSError):  # the child ended: the next request raises DeciderError
                write_holding_lock(self._to, REQUEST.pack(EXPECT, in_s, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0))

    def _ask(self, request: bytes, response: struct.Struct | None = None) -> tuple[Any, ...]:
        """The child's answer to ``request``, as ``response`` (default: :func:`_response`) unpacks it."""
        response = self._response if response is None else response
        try:
            write_holding_lock(self._to, request)
            answer = _read_exact(self._from, response.size)
        except OSError:
            answer = None
        if answer is None:
            raise DeciderError(f"the online decision process ended (exit code {self._process.poll()}); the "
                               "controller stops and the GPU goes back to auto")
        return response.unpack(answer)

    def close(self) -> None:
        """End the child process (idempotent): close its pipe, then kill it if it has not ended."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()


def _warm_until_request(fd: int, due_s: float, warm_s: float, warm: Callable[[], None]) -> float:
    """Sleep until ``warm_s`` before ``due_s`` (perf_counter s) unless a request comes first; then ``warm()``
    and poll ``fd`` without sleeping until a request is readable or ``SPIN_AFTER_S`` past ``due_s``.
    Returns how long it polled (s)."""
    if select.select([fd], [], [], max(0.0, due_s - warm_s - time.perf_counter()))[0]:
        return 0.0
    warm()
    began_s = end_s = time.perf_counter()
    while not select.select([fd], [], [], 0.0)[0] and end_s < due_s + SPIN_AFTER_S:
        end_s = time.perf_counter()
    return end_s - began_s


def _answer(online: OnlinePolicy, response: struct.Struct, kind: int, value: float, state: LiveState | None,
            spun_s: float) -> bytes:
    """The answer to a BEGIN, LOOK_AHEAD or DECIDE request (``state``: the DECIDE's; ``response``: the policy's
    :func:`_response`)."""
    if kind == BEGIN:
        return response.pack(online.begin(value), True, *[0] * len(online.policy.nvec), 0.0, 0.0, 0, 0.0, 0.0, 0.0)
    if kind == LOOK_AHEAD:
        return LOOKED_AHEAD.pack(*online.look_ahead(int(value)))
    assert state is not None, "a DECIDE request carries its state"
    began_s = time.perf_counter()
    decision = online.decide(state, value)
    next_change = NO_CHANGE_KNOWN if decision.next_change is None else decision.next_change
    return response.pack(decision.pair, decision.evaluated, *decision.action, decision.budget_used,
                         decision.affordable_pct, next_change, decision.policy_due_s,
                         (time.perf_counter() - began_s) * 1e6, spun_s * 1e6)


def serve(requests: IO[bytes], answers: IO[bytes]) -> int:
    """The child process: build the policy from the payload on ``requests``, answer until its end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    to_parent, from_parent = answers.fileno(), requests.fileno()
    header = _read_exact(from_parent, SIZE.size)
    if header is None:
        return 1
    payload = _read_exact(from_parent, SIZE.unpack(header)[0])
    if payload is None:
        return 1
    policy, problem, warm_s = pickle.loads(payload)
    online, response = OnlinePolicy(policy, problem), _response(len(policy.nvec))
    online.prepare()
    os.write(to_parent, b"R")
    last: LiveState | None = None
    due_s: float | None = None
    while True:
        spun_s = 0.0
        if due_s is not None and last is not None:
            spun_s = _warm_until_request(from_parent, due_s, warm_s, functools.partial(online.warm, last))
        due_s = None
        request = _read_exact(from_parent, REQUEST.size)
        if request is None:
            return 0
        kind, value, *fields = REQUEST.unpack(request)
        if kind == EXPECT:
            due_s = time.perf_counter() + value
            continue
        if kind == DECIDE:
            last = LiveState(*fields)
        os.write(to_parent, _answer(online, response, kind, value, last, spun_s))


if __name__ == "__main__":
    sys.exit(serve(sys.stdin.buffer, sys.stdout.buffer))
