"""Which kernel of the captured step each anchor stands for, from the step's structure rather than its timing.

The anchors' hooks (:mod:`kdvfs.runtime.controller.anchors`) sit at the top-level blocks: one before each
hooked block's forward, one where each hooked block's backward starts (in reverse order), one before the
optimizer step. A transformer's (or a ResNet stage's) blocks launch the same kernels, so in the captured
trace each phase holds one pattern of kernel names repeated once per block. :func:`periodic_starts` finds
where each repetition starts; the i-th anchor of a step then stands for the i-th hooked block's first kernel
in its phase (the optimizer's: the first optimizer kernel).

Mapping anchors by time instead (their live offsets from the step's start against the captured kernel
starts, :func:`kdvfs.runtime.controller.anchoring.nearest_kernels`) picks the wrong block when the live
step's idle gaps lie elsewhere than the capture's by about a block's time: on an H200, GPT-2 small under the
Hugging Face Trainer at batch 32 spent ~3.5 ms more idle before its first kernel than its capture, and each
forward anchor was mapped ~30 kernels (most of a block) late, so every kernel start planned from one was
~2-4 ms early (``docs/controller.md``). Where the structure does not fit the anchors seen (another count,
no repeated pattern covering half a phase), the time mapping stays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kdvfs.envs.trace.trace import Phase, Trace


def periodic_starts(names: Sequence[str], repetitions: int) -> list[int] | None:
    """Where each of ``repetitions`` back-to-back repetitions of one pattern starts in ``names``: for the shortest
    period whose longest periodic stretch (``names[i] == names[i + period]`` throughout) holds exactly that many
    whole repetitions and covers at least half of ``names``; None if no period does. The stretch may begin a
    few kernels before the true first repetition where the kernels before it end like the pattern does."""
    count = len(names)
    if repetitions < 1:
        return None
    for period in range(1, count // repetitions + 1):
        best_start, best_length, length = 0, 0, 0
        for i in range(count - period):
            length = length + 1 if names[i] == names[i + period] else 0
            if length > best_length:
                best_start, best_length = i - length + 1, length
        covered = best_length + period
        if covered // period == repetitions and 2 * covered >= count:
            return [best_start + r * period for r in range(repetitions)]
    return None


class TraceStructure:
    """The anchors' kernels from ``trace``'s structure (see the module docstring).

    Args:
        trace: the captured step.
        every: the hooks' ``anchor_every`` (every N-th block carries them).
        blocks: the number of top-level blocks the hooks found (0 until the model's first forward).
    """

    def __init__(self, trace: Trace, every: int, blocks: Callable[[], int]) -> None:
        self._names = [kernel.name for kernel in trace.kernels]
        self._phases = [kernel.phase for kernel in trace.kernels]
        self.every, self._blocks = every, blocks
        self._found: dict[tuple[int, int], tuple[int, ...] | None] = {}
        """:meth:`kernels` by (blocks, anchors): the anchor map asks at every step it learns from, on the
        controller's thread, and the search is ~10^5 name comparisons (ms, holding the interpreter lock)."""

    def _starts(self, phase: Phase, blocks: int) -> list[int] | None:
        """Each block's first kernel in ``phase`` (kernel indices, in the order the phase runs them)."""
        indices = [i for i, kernel_phase in enumerate(self._phases) if kernel_phase == phase]
        starts = periodic_starts([self._names[i] for i in indices], blocks)
        return None if starts is None else [indices[start] for start in starts]

    def kernels(self, anchors: int) -> tuple[int, ...] | None:
        """The kernel each of a step's ``anchors`` anchors stands for, or None where the structure does not give
        that many: the hooked blocks' forward anchors, then (with twice as many anchors) their backward ones,
        then (with one more) the optimizer's."""
        blocks = self._blocks()
        if (blocks, anchors) not in self._found:
            self._found[blocks, anchors] = self._kernels(blocks, anchors)
        return self._found[blocks, anchors]

    def _kernels(self, blocks: int, anchors: int) -> tuple[int, ...] | None:
        hooked = list(range(0, blocks, self.every))
        k = len(hooked)
        if not k or anchors not in (k, k + 1, 2 * k, 2 * k + 1) or (k == 1 and anchors == 2):  # 2: ambiguous
            return None
        forward = self._starts(Phase.FORWARD, blocks)
        if forward is None:
            return None
        found = [forward[b] for b in hooked]
        if anchors >= 2 * k:
            backward = self._starts(Phase.BACKWARD, blocks)  # block B - 1's backward runs first
            if backward is None:
                return None
            found += [backward[blocks - 1 - b] for b in reversed(hooked)]
        if anchors in (k + 1, 2 * k + 1):
            found += [i for i, phase in enumerate(self._phases) if phase == Phase.OPTIMIZER][:1]
        return tuple(found) if len(found) == anchors else None
