"""The shape of a training step, as known when the step starts: the key of steps whose kernels vary.

A step's kernels (their number, their names, their durations) follow from the shapes of the tensors the
training loop hands the model. Those shapes are known on the host before the step's first kernel is
launched, for the price of reading a few ``.shape`` tuples in a forward pre-hook on the model, so they are
what a capture keys each recorded step by, what the runtime reads at the start of each step to pick the
step's expected kernels, and what the step model (:mod:`kdvfs.envs.model.step_model`) predicts kernels from.

Convention: :attr:`StepShape.inputs` lists the shapes of the tensor arguments of the model's first forward
call in the step, positional arguments first in order, then keyword arguments sorted by name; non-tensor
arguments are left out. The shape variables the step model uses are :attr:`batch` (the first input's first
dimension) and :attr:`seq` (its second dimension when it has exactly two, as token ids ``[batch, seq]``
do; 1 otherwise, as images ``[batch, channels, height, width]`` have no sequence).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kdvfs.common.errors import TraceFormatError

MAX_INPUTS = 64
"""Most tensor inputs a step shape records: a model's forward takes a handful."""
MAX_DIM = 2**48
"""Largest tensor dimension a step shape accepts (the trace format's op-dimension bound)."""


@dataclass(frozen=True, order=True)
class StepShape:
    """The shapes of the tensors of a step's first forward call (see the module docstring). Immutable, hashable,
    ordered (by the shapes), so it keys dictionaries and sorts deterministically.

    Attributes:
        inputs: one shape (a tuple of non-negative ints) per tensor input, in the module docstring's order.
    """

    inputs: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if len(self.inputs) > MAX_INPUTS:
            raise TraceFormatError(f"a step shape holds at most {MAX_INPUTS} inputs, not {len(self.inputs)}")
        for dims in self.inputs:
            if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIM for d in dims):
                raise TraceFormatError(f"step shape dims must be integers in [0, 2^48], not {list(dims)}")

    @property
    def batch(self) -> int:
        """The first input's first dimension (1 without inputs or for a scalar)."""
        return self.inputs[0][0] if self.inputs and self.inputs[0] else 1

    @property
    def seq(self) -> int:
        """The first input's second dimension when it has exactly two (token ids), else 1."""
        return self.inputs[0][1] if self.inputs and len(self.inputs[0]) == 2 else 1

    @property
    def tokens(self) -> int:
        """``batch * seq``: the tokens (or images) of the step."""
        return self.batch * self.seq

    @property
    def elements(self) -> int:
        """Elements of the first input (its product of dimensions; 1 without inputs)."""
        return math.prod(self.inputs[0]) if self.inputs else 1

    @property
    def key(self) -> str:
        """A short readable label: ``8x512`` per input, inputs joined by ``+`` (``-`` without inputs)."""
        return "+".join("x".join(map(str, dims)) or "scalar" for dims in self.inputs) or "-"

    def to_json(self) -> list[list[int]]:
        """The JSON form: a list of shapes."""
        return [list(dims) for dims in self.inputs]

    @classmethod
    def from_json(cls, value: Any) -> StepShape:
        """Parse :meth:`to_json`'s form; a :class:`TraceFormatError` for anything else."""
        if not isinstance(value, list) or not all(isinstance(dims, list) for dims in value):
            raise TraceFormatError(f"a step shape must be a list of shapes (lists of integers), not {value!r}")
        return cls(tuple(tuple(dims) for dims in value))

    @classmethod
    def of(cls, shapes: Sequence[Sequence[int]]) -> StepShape:
        """From a sequence of shapes (e.g. ``[(8, 512), (8, 512)]``)."""
        return cls(tuple(tuple(int(d) for d in dims) for dims in shapes))


LENGTH_KEYWORDS = frozenset({"max_length_k", "max_length_q"})
"""Keyword arguments that are plain integers the kernels follow, recorded as a one-row sequence ``(1, length)``:
the longest sequence of a packed batch, which Hugging Face's ``DataCollatorWithFlattening(return_flash_attn_kwargs=
True)`` passes beside the sequences' offsets (``cu_seq_lens_*``, tensors the host cannot read without a GPU sync).
With varlen flash attention a packed row's attention work is the sum of its sequences' squared lengths, which
the row's tokens and sequence count do not tell; tokens times the longest length bound it, and the step model's
cross column of the two variables is that product (:mod:`kdvfs.envs.model.step.shape_fit`). Hugging Face's SDPA
path ignores these keywords and attends over the whole row with a mask: its work follows the tokens' square."""


def call_shape(args: Sequence[Any], kwargs: dict[str, Any]) -> StepShape:
    """The step shape of one forward call: the ``.shape`` of each argument that has one (a tensor), positional
    arguments first, then keyword arguments sorted by name, among them each integer of ``LENGTH_KEYWORDS`` as
    ``(1, length)``. Reads no tensor data (no GPU sync)."""
    named = [(None, value) for value in args] + [(name, kwargs[name]) for name in sorted(kwargs)]
    return StepShape(tuple(dims for name, value in named if (dims := _dims(name, value)) is not None))


def _dims(name: str | None, value: Any) -> tuple[int, ...] | None:
    """An argument's dimensions in a step shape (None: not in it)."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return tuple(int(d) for d in value.shape)
    if name in LENGTH_KEYWORDS and isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return (1, value)
    return None


Position = tuple[int, int]
"""One dimension of a step shape: (input index, dimension index)."""


@dataclass(frozen=True)
class ShapeAxes:
    """What varies between the steps of one model, found from a set of its step shapes: the shape's variables.

    A *length class* is a set of dimensions (:data:`Position`) that vary across the shapes and are equal in
    every one of them (a decoder's ``input_ids``, ``attention_mask`` and ``labels`` share their sequence length;
    an encoder-decoder's labels have their own; each micro-batch of a step with gradient accumulation has its
    own). A *variable* is one input holding a length class (the first such), and its value at a shape is that
    input's number of elements (``batch x seq`` for token ids, the total tokens of a packed batch, the number
    of sequences plus one for ``cu_seq_lens``); its *length* is the input's last varying dimension. A set whose
    shapes all agree has one variable: the first input (its tokens), as a step of one shape is keyed.

    Attributes:
        structure: the number of dimensions of each input (what the shapes share).
        classes: the length classes, each a sorted tuple of positions, in the order of their first position.
        exact: for each class, whether it is a batch size (only first dimensions of inputs of two dimensions or
            more): a bucket keeps it exact; other classes are rounded up.
        variables: the input index of each variable, sorted.
        lengths: for each variable, the dimension index of its length (-1: the input has one dimension).
    """

    structure: tuple[int, ...]
    classes: tuple[tuple[Position, ...], ...]
    exact: tuple[bool, ...]
    variables: tuple[int, ...]
    lengths: tuple[int, ...]

    @classmethod
    def of(cls, shapes: Sequence[StepShape]) -> ShapeAxes:
        """The axes of ``shapes`` (one model's: the shapes of another structure than the first are ignored)."""
        if not shapes:
            return cls((), (), (), (), ())
        structure = tuple(len(dims) for dims in shapes[0].inputs)
        same = [s for s in shapes if tuple(len(dims) for dims in s.inputs) == structure]
        positions = [(i, d) for i, rank in enumerate(structure) for d in range(rank)]
        groups: dict[tuple[int, ...], list[Position]] = {}
        for i, d in positions:
            values = tuple(s.inputs[i][d] for s in same)
            if len(set(values)) > 1:
                groups.setdefault(values, []).append((i, d))
        classes = tuple(sorted(tuple(sorted(group)) for group in groups.values()))
        exact = tuple(all(d == 0 and structure[i] >= 2 for i, d in group) for group in classes)
        holders = sorted({group[0][0] for group in classes}) or ([0] if structure else [])
        lengths = []
        for i in holders:
            varying = [d for group in classes for j, d in group if j == i and d > 0]
            lengths.append(max(varying) if varying and structure[i] >= 2 else (1 if structure[i] == 2 else -1))
        return cls(structure, classes, exact, tuple(holders), tuple(lengths))

    def fits(self, shape: StepShape) -> bool:
        """Whether ``shape`` has this structure."""
        return tuple(len(dims) for dims in shape.inputs) == self.structure

    def values(self, shape: StepShape) -> tuple[int, ...]:
        """Each variable's value at ``shape``: its input's number of elements."""
        return tuple(math.prod(shape.inputs[i]) for i in self.variables)

    def length_values(self, shape: StepShape) -> tuple[int, ...]:
        """Each variable's length at ``shape`` (1 for an input of one dimension)."""
        return tuple(shape.inputs[i][d] if d >= 0 else 1 for i, d in zip(self.variables, self.lengths, strict=True))

    def size(self, shape: StepShape) -> int:
        """The step's size: the sum of its variables (the tokens of a step of one sequence length)."""
        return sum(self.values(shape))

    def class_values(self, shape: StepShape) -> tuple[int, ...]:
        """Each length class's value at ``shape`` (its first position's)."""
        return tuple(shape.inputs[i][d] for (i, d), *_ in self.classes)

    def with_classes(self, shape: StepShape, values: Sequence[int]) -> StepShape:
        """``shape`` with each length class set to ``values`` at every one of its positions."""
        dims = [list(d) for d in shape.inputs]
        for group, value in zip(self.classes, values, strict=True):
            for i, d in group:
                dims[i][d] = int(value)
        return StepShape.of(dims)
