"""The shape of each training step as it starts, read from the model's first forward call: :class:`ShapeProbe`.

Shared by the capture (which keys every recorded step by its shape) and the runtime (which reads a step's
shape at its start to pick the step's expected kernels). The shape is :func:`kdvfs.envs.trace.shape.call_shape`
of each of the model root's forward calls (with gradients) between two step boundaries, concatenated: the
shapes of its tensor arguments, positional first, keyword arguments by name (:mod:`kdvfs.envs.trace.shape`).
A step with gradient accumulation is keyed by all its micro-batches: its shape holds each micro-batch's inputs
in turn, so two steps whose second micro-batches differ have different shapes.

How it finds the model: :meth:`ShapeProbe.install` registers a global module forward pre-hook; the first module
called with gradients enabled that owns parameters (itself or in its children) is the model root, normally the
model the training loop calls (a preprocessing module without parameters, or an evaluation pass under
``torch.no_grad``, is skipped). The global hook then removes itself and a forward pre-hook
(``with_kwargs=True``) goes on the root; it costs one flag test per forward call, and reads shapes (a few
``.shape`` tuples, never tensor data: no GPU sync) once per step. A compiled model (``torch.compile``, an
``OptimizedModule``) is called through its wrapper, an ordinary module: the hook sits on the wrapper and runs
in eager Python before the compiled graph.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from kdvfs.envs.trace.shape import StepShape, call_shape

HISTORY_STEPS = 4096
"""Steps whose shapes :meth:`ShapeProbe.shape_of` remembers by default (the most recent ones)."""
CALL_SHAPES = 4096
"""Distinct forward-call shapes :meth:`ShapeProbe.first_seen` remembers (the most recently run): a run whose every
step has a new shape (packing) would otherwise grow the set for good; a shape not run among the last ones counts
as new again."""


def _owns_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _remember(seen: OrderedDict[Any, None], key: Any) -> bool:
    """Whether ``key`` is new to ``seen`` (the last ``CALL_SHAPES`` keys, most recent last); remember it there."""
    if key in seen:
        seen.move_to_end(key)
        return False
    seen[key] = None
    if len(seen) > CALL_SHAPES:
        seen.popitem(last=False)
    return True


class ShapeProbe:
    """Records the step shape of every training step (see the module docstring).

    Contract:
        * Steps are numbered from 0 in the order they run. :meth:`mark_step` ends the step in progress (call it
          once per training step, at its end: ``kdvfs capture`` calls it from the optimizer-step hook) and
          returns that step's number; the next step gets the next number.
        * Each forward call of the model root with gradients enabled appends its inputs to the step's shape
          (gradient accumulation: one call per micro-batch). The call in which :meth:`install`'s discovery finds
          the root is not recorded (a global hook is not passed keyword arguments), so that step, normally
          step 0, has no shape or a partial one; with :meth:`attach` every step has one.
        * :meth:`shape_of` returns a step's shape so far (all its calls once the step ended), None for a step
          without a forward call (or before the root was found) and for steps older than the last ``history``
          steps. :attr:`current` is the shape of the step in progress, None until its first forward call.
        * :meth:`first_seen` says whether a step ran a forward call of a shape that no earlier step's calls had
          (such a step pays one-time host set-up: a new shape's allocations, attention plans, kernel choice;
          the last ``CALL_SHAPES`` distinct call shapes are remembered), None where :meth:`shape_of` is None.
        * :meth:`new_inputs` counts, for each input position, a step's forward calls whose input there had a
          shape no earlier call had at that position (the same bound per position). It measures how much set-up
          a step pays and where it comes from, where :meth:`first_seen` only says whether: with gradient
          accumulation two new micro-batches count twice, and an input that varies alone (a packed batch's
          longest sample) counts apart from those the model's matrix shapes follow (its tokens).
        * ``on_shape(step, shape)``, when given, is called from the forward pre-hook on the training thread at
          each call with the step's shape so far, before that call launches any model kernel; it must be cheap
          and must not raise.
        * Thread use: the hooks and :meth:`mark_step` run on the training thread; the other methods only read.
        * :meth:`remove` removes every hook (idempotent); recorded shapes stay readable.

    Attributes:
        root: the module the probe hooked (None until found).
        steps_marked: the number of :meth:`mark_step` calls so far (the number of the step in progress).
    """

    def __init__(self, on_shape: Callable[[int, StepShape], None] | None = None,
                 history: int = HISTORY_STEPS) -> None:
        self.on_shape = on_shape
        self.history = history
        self.root: nn.Module | None = None
        self.steps_marked = 0
        self._shapes: OrderedDict[int, StepShape] = OrderedDict()
        self._calls_seen: OrderedDict[StepShape, None] = OrderedDict()
        self._first_seen: set[int] = set()
        self._inputs_seen: list[OrderedDict[tuple[int, ...], None]] = []
        self._new_inputs: dict[int, list[int]] = {}
        self._discovery: Any = None
        self._handle: Any = None

    def install(self) -> ShapeProbe:
        """Start looking for the model root (the next module called; see the module docstring). Returns self."""
        from torch.nn.modules.module import register_module_forward_pre_hook

        if self._discovery is None and self._handle is None:
            self._discovery = register_module_forward_pre_hook(self._discover)
        return self

    def attach(self, root: nn.Module) -> ShapeProbe:
        """Hook ``root`` directly (no discovery): for code that holds its model. Returns self."""
        self._end_discovery()
        if self._handle is None:
            self.root = root
            self._handle = root.register_forward_pre_hook(self._before_forward, with_kwargs=True)
        return self

    def _discover(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled() and _owns_parameters(module):
            self.attach(module)  # a global hook sees no keyword arguments: this call's shape stays unknown

    def _end_discovery(self) -> None:
        if self._discovery is not None:
            self._discovery.remove()
            self._discovery = None

    def _before_forward(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        step = self.steps_marked
        if not torch.is_grad_enabled() or torch.compiler.is_compiling():
            return None
        shape = call_shape(args, kwargs or {})
        if _remember(self._calls_seen, shape):
            self._first_seen.add(step)
        counts = self._new_inputs.setdefault(step, [])
        for position, new in enumerate(self._new_at_position(shape)):
            if position == len(counts):
                counts.append(0)
            counts[position] += new
        earlier = self._shapes.get(step)
        if earlier is not None:
            shape = StepShape(earlier.inputs + shape.inputs)
        self._shapes[step] = shape
        while len(self._shapes) > self.history:
            oldest = self._shapes.popitem(last=False)[0]
            self._first_seen.discard(oldest)
            self._new_inputs.pop(oldest, None)
        if self.on_shape is not None:
            self.on_shape(step, shape)
        return None

    def _new_at_position(self, call: StepShape) -> list[bool]:
        """For each of one call's inputs, whether its shape is new at its position (and remember them)."""
        while len(self._inputs_seen) < len(call.inputs):
            self._inputs_seen.append(OrderedDict())
        return [_remember(seen, dims) for dims, seen in zip(call.inputs, self._inputs_seen, strict=False)]

    def mark_step(self) -> int:
        """End the step in progress; its number."""
        self.steps_marked += 1
        return self.steps_marked - 1

    def shape_of(self, step: int) -> StepShape | None:
        """The shape of step ``step`` (None: unknown, see the contract)."""
        return self._shapes.get(step)

    def first_seen(self, step: int) -> bool | None:
        """Whether step ``step`` ran a forward call of a shape new to the process (None: unknown, see the
        contract)."""
        return None if step not in self._shapes else step in self._first_seen

    def new_inputs(self, step: int) -> tuple[int, ...] | None:
        """For each input position, how many of step ``step``'s forward calls had a shape new there (None:
        unknown, see the contract)."""
        return None if step not in self._shapes else tuple(self._new_inputs.get(step, ()))

    @property
    def current(self) -> StepShape | None:
        """The shape of the step in progress (None until its first forward call)."""
        return self._shapes.get(self.steps_marked)

    def remove(self) -> None:
        """Remove the hooks (idempotent)."""
        self._end_discovery()
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
