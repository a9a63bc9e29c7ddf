"""What is in effect on the GPU while the online policy decides (:class:`LiveClocks`): the clocks requested,
a change pending, when it was decided and when requested, and when it took effect (see
docs/design/controller.md, "Online decisions", "clocks in effect")."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from kdvfs.agents.learned.policy.deciders import OnlineDecider
from kdvfs.agents.learned.policy.live_decision import NO_REQUEST
from kdvfs.runtime.controller.decisions.actuator import Actuator, parse_clocks
from kdvfs.runtime.device.interface import Device

CORE_MATCH_MHZ = 15.0
"""A read core clock within this of a locked one has reached it (one clock step)."""
TIMEOUT_SDS = 3.0


@dataclass
class LiveClocks:
    """What is in effect on the GPU, from the actuator's requests and clock reads (see the module docstring)."""

    online: OnlineDecider
    actuator: Actuator
    device: Device | None
    latency_s: float
    latency_std_s: float
    dry_run: bool
    in_effect: int = 0
    pending: int = NO_REQUEST
    requested_s: float = 0.0
    """When the pending change was decided (host s): its age in the observation counts from here."""
    issued_s: float = 0.0
    """When its request went out (host s): its arrival counts from here."""
    held: bool = False
    """The pending change is decided and its request not out yet (:meth:`hold`)."""
    last_latency_ratio: float = 1.0
    took_effect: Counter[str] = field(default_factory=Counter)
    _label: str = field(init=False)
    _clocks_mhz: tuple[int | None, int] = field(init=False)
    """The last request's clocks (:func:`parse_clocks` of ``_label``)."""

    def __post_init__(self) -> None:
        self._follow()
        self.in_effect = self.online.pair_of(self._label)

    def _follow(self) -> None:
        self._label = self.actuator.current
        self._clocks_mhz = parse_clocks(self._label)

    def hold(self, pair: int, decided_s: float) -> None:
        """``pair`` was decided at ``decided_s`` (host s) and its request goes out later: pending until then."""
        self.pending, self.requested_s, self.held = pair, decided_s, True

    def drop(self) -> None:
        """Forget a held change whose request never went out."""
        if self.held:
            self.pending, self.held = NO_REQUEST, False

    def update(self, now_s: float) -> None:
        """Follow the actuator's last request and whether it has taken effect by ``now_s`` (host s)."""
        if self.actuator.current != self._label:
            self._follow()
            pair = self.online.pair_of(self._label)
            if not (self.held and pair == self.pending):  # not the held change's request: a change of its own
                self.pending, self.requested_s = pair, self.actuator.issued_s
            self.issued_s, self.held = self.actuator.issued_s, False
        if self.pending == NO_REQUEST or self.held:
            return
        age_s = now_s - self.issued_s
        core_mhz, mem_mhz = self._clocks_mhz
        if self.dry_run or core_mhz is None or self.device is None:
            if age_s >= self.latency_s:
                self._arrive("assumed", age_s)
            return
        read_core_mhz, read_mem_mhz = self.device.clocks_mhz()
        if abs(read_core_mhz - core_mhz) <= CORE_MATCH_MHZ and int(read_mem_mhz) == mem_mhz:
            self._arrive("observed", age_s)
        elif age_s >= self.latency_s + TIMEOUT_SDS * self.latency_std_s:
            self._arrive("timeout", age_s)

    def _arrive(self, how: str, age_s: float) -> None:
        self.took_effect[how] += 1
        if how == "observed" and self.latency_s > 0:
            self.last_latency_ratio = age_s / self.latency_s
        self.in_effect, self.pending = self.pending, NO_REQUEST

    @property
    def free(self) -> bool:
        return self.pending == NO_REQUEST

    def arrival_check_s(self, now_s: float, poll_s: float) -> float:
        """When to look next whether the pending change took effect (host s; inf if none or held): a mean latency after
        the request where it is assumed, else read from one spread before that, every ``poll_s``, until it is
        seen or times out."""
        if self.free or self.held:
            return math.inf
        if self.dry_run or self.device is None or self._clocks_mhz[0] is None:
            return self.issued_s + self.latency_s
        first_s = self.issued_s + max(self.latency_s - self.latency_std_s, 0.0)
        return first_s if now_s < first_s else min(now_s + poll_s, self.issued_s + self.latency_s
                                                   + TIMEOUT_SDS * self.latency_std_s)
