"""The anchors' kernels from the captured step's structure (repeated blocks), and the anchor map using them."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kdvfs.envs.trace.trace import Category, Kernel, Kind, Phase, Trace, TraceMeta
from kdvfs.runtime.controller.timing.anchors import AnchorMap, TraceStructure, periodic_starts

BLOCK = ["ln", "qkv", "attn", "proj", "add", "ln", "fc1", "gelu", "fc2", "add"]


def _phase(prefix: list[str], block: list[str], blocks: int, suffix: list[str]) -> list[str]:
    return prefix + block * blocks + suffix


@given(st.lists(st.sampled_from(["embed", "gather", "mask", "copy"]), max_size=6),
       st.integers(min_value=2, max_value=8), st.lists(st.sampled_from(["lnf", "head", "loss"]), max_size=4))
def test_each_block_starts_where_its_pattern_repeats(prefix: list[str], blocks: int, suffix: list[str]) -> None:
    names = _phase(prefix, BLOCK, blocks, suffix)
    assert periodic_starts(names, blocks) == [len(prefix) + b * len(BLOCK) for b in range(blocks)]


def test_a_stretch_that_ends_like_the_block_starts_a_little_early_and_a_sub_period_is_not_taken() -> None:
    names = _phase(["embed", "fc2", "add"], BLOCK, 4, ["lnf"])  # the prefix ends as a block does
    assert periodic_starts(names, 4) == [1 + b * len(BLOCK) for b in range(4)]
    halves = ["a", "b", "c"] * 2
    assert periodic_starts(_phase(["x"], halves, 3, []), 3) == [1, 7, 13]  # the block, not its half
    assert periodic_starts(["m"] * 5 + ["x", "y", "z"] * 3, 5) is None  # a run of memsets is not the blocks
    assert periodic_starts(BLOCK * 3, 4) is None


def _trace(blocks: int) -> Trace:
    def kernels(names: list[str], phase: Phase) -> list[Kernel]:
        return [Kernel(name, Kind.KERNEL, Category.OTHER, phase, 1e-5, 1e-6) for name in names]

    forward = kernels(_phase(["embed", "mask"], BLOCK, blocks, ["lnf", "head"]), Phase.FORWARD)
    backward = kernels(_phase(["head_b", "lnf_b"], [f"{n}_b" for n in reversed(BLOCK)], blocks, ["embed_b"]),
                       Phase.BACKWARD)
    optimizer = kernels(["adam", "adam"], Phase.OPTIMIZER)
    return Trace(TraceMeta("gpu", "w", "s"), tuple(forward + backward + optimizer))


def test_the_anchors_stand_for_the_hooked_blocks_first_kernels_in_order() -> None:
    trace = _trace(blocks=4)
    forward_starts = [2 + 10 * b for b in range(4)]
    backward_first = len(BLOCK) * 4 + 4 + 2  # the forward's kernels, then the head's and final norm's backward
    backward_starts = [backward_first + 10 * (3 - b) for b in range(4)]  # block 3's backward runs first
    optimizer = (len(BLOCK) * 4 + 4) + (len(BLOCK) * 4 + 3)  # after the forward's and the backward's kernels
    every = TraceStructure(trace, every=1, blocks=lambda: 4)
    assert every.kernels(9) == (*forward_starts, *backward_starts[::-1], optimizer)
    assert every.kernels(8) == (*forward_starts, *backward_starts[::-1])
    assert every.kernels(5) == (*forward_starts, optimizer)
    assert every.kernels(4) == tuple(forward_starts)
    assert every.kernels(7) is None  # no such count of hooks
    second = TraceStructure(trace, every=2, blocks=lambda: 4)  # blocks 0 and 2 carry the hooks
    assert second.kernels(5) == (forward_starts[0], forward_starts[2], backward_starts[2], backward_starts[0],
                                 optimizer)
    assert TraceStructure(trace, every=1, blocks=lambda: 0).kernels(9) is None  # no forward seen yet
    found = [0]
    later = TraceStructure(trace, every=1, blocks=lambda: found[0])
    assert later.kernels(9) is None
    found[0] = 4  # the hooks found the blocks at the model's first forward
    assert later.kernels(9) == every.kernels(9)
    assert TraceStructure(trace, every=1, blocks=lambda: 5).kernels(11) is None  # not the trace's blocks


def test_the_anchor_map_takes_the_structure_where_time_would_pick_the_next_block() -> None:
    """Anchors one block's time late against the captured timeline (more idle before the step's first kernel
    than at capture): by time each maps to the next block, by structure to its own."""
    trace = _trace(blocks=4)
    starts_s = np.arange(len(trace.kernels)) * 1e-4
    expected_s = float(starts_s[-1] + 1e-4)
    structure = TraceStructure(trace, every=1, blocks=lambda: 4)
    truth = structure.kernels(9)
    assert truth is not None
    late_s = starts_s[list(truth)] + 10 * 1e-4  # a block (10 kernels) later than captured
    late_s[-1] = starts_s[truth[-1]]
    maps = {"time": AnchorMap(starts_s, expected_s, learn_steps=2),
            "structure": AnchorMap(starts_s, expected_s, learn_steps=2, structure=structure.kernels)}
    for anchor_map in maps.values():
        for _ in range(2):
            anchor_map.observe(0.0, expected_s, late_s)
    assert [a.kernel for a in maps["structure"].anchors] == list(truth) and maps["structure"].mapped_by == "structure"
    assert [a.kernel for a in maps["time"].anchors][:4] == [k + 10 for k in truth[:4]]
    assert maps["time"].mapped_by == "time"
    fallback = AnchorMap(starts_s, expected_s, learn_steps=2, structure=structure.kernels)
    for _ in range(2):
        fallback.observe(0.0, expected_s, late_s[:7])  # 7 anchors: no structure of that count
    assert fallback.mapped_by == "time" and len(fallback.anchors) == 7
