"""Anchor points inside the training step: cheap places where the training code records a CUDA event.

Step boundaries alone leave the controller blind inside the step: it can only stretch the captured timeline
by the recent step times, so any variation of this step's length accumulates along it. These hooks record,
through ``record`` (:meth:`CudaStepTimeline.anchor`), a timestamp event on the current stream

* before each top-level block's forward (a forward pre-hook on the block),
* when the gradient of each block's output is ready, i.e. where the block's backward starts (a pre-hook on
  the output's ``grad_fn``, registered by a forward hook; only when the output has one: it requires grad and
  is not a leaf). Not ``Tensor.register_hook``, which adds the same pre-hook through a Python wrapper that
  costs the training thread more CPU per block and step.
* before each optimizer step (the global ``torch.optim`` pre-step hook): where the backward ends.

With ``every`` N > 1 only every N-th block (the first, the N+1-th, ...) carries the two hooks.

Top-level blocks are the elements of the outermost ``nn.ModuleList`` / ``nn.Sequential`` containers (of at
least ``MIN_BLOCKS`` modules) under the first module called after :meth:`AnchorHooks.install`, normally the
model itself (a transformer's layers, a ResNet's stages' blocks). A global module forward pre-hook looks for
them at the first ``DISCOVERY_CALLS`` module calls and removes itself; after that only the blocks carry
hooks (a few microseconds each per step). A compiled model (``torch.compile``) gets no anchors: an event
record inside a compiled region would break its graph. Nothing here decides anything: anchors that do not
fire, or fire in another order, are detected by the controller's thread, which then keeps the step-level
timeline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

MIN_BLOCKS = 2
DISCOVERY_CALLS = 1000


def find_blocks(root: nn.Module) -> list[nn.Module]:
    """The elements of the outermost ``ModuleList`` / ``Sequential`` containers under ``root`` (``root``'s own,
    if it is one) that hold at least ``MIN_BLOCKS`` modules, in registration order."""
    if isinstance(root, nn.ModuleList | nn.Sequential) and len(root) >= MIN_BLOCKS:
        return list(root)
    blocks: list[nn.Module] = []
    for child in root.children():
        blocks += find_blocks(child)
    return blocks


def _compiled(module: nn.Module) -> bool:
    """True for a ``torch.compile`` wrapper, or while dynamo traces."""
    return type(module).__name__ == "OptimizedModule" or torch.compiler.is_compiling()


class AnchorHooks:
    """Installs the hooks of the module docstring; each hook calls ``record()`` (thread-safe, cheap); ``every``:
    hook every N-th top-level block only.

    Attributes:
        blocks: the number of top-level blocks found (0 until the model's first forward, or none found).
    """

    def __init__(self, record: Callable[[], None], every: int = 1) -> None:
        self.record, self.every = record, every
        self.blocks = 0
        self._handles: list[Any] = []
        self._discovery: Any = None
        self._calls = 0
        self._active = True

    def install(self) -> None:
        """Start looking for the blocks and hook the optimizer step."""
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._handles.append(register_optimizer_step_pre_hook(self._before_optimizer_step))
        self._discovery = register_module_forward_pre_hook(self._discover)

    def _discover(self, module: nn.Module, args: Any) -> None:
        self._calls += 1
        blocks = [] if _compiled(module) else find_blocks(module)
        if blocks or self._calls >= DISCOVERY_CALLS or _compiled(module):
            self._end_discovery()
        for block in blocks[::self.every]:
            self._handles.append(block.register_forward_pre_hook(self._before_block))
            self._handles.append(block.register_forward_hook(self._after_block))
        self.blocks = len(blocks)

    def _end_discovery(self) -> None:
        if self._discovery is not None:
            self._discovery.remove()
            self._discovery = None

    def _before_block(self, module: nn.Module, args: Any) -> None:
        if not torch.compiler.is_compiling():
            self.record()

    def _after_block(self, module: nn.Module, args: Any, output: Any) -> None:
        if isinstance(output, Tensor) and output.grad_fn is not None and not torch.compiler.is_compiling():
            output.grad_fn.register_prehook(self._on_gradient)

    def _on_gradient(self, gradients: tuple[Tensor | None, ...]) -> None:
        if self._active:
            self.record()

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.record()

    def remove(self) -> None:
        """Remove every hook (idempotent); tensor hooks already on live tensors record nothing more."""
        self._active = False
        self._end_discovery()
        for handle in self._handles:
            handle.remove()
        self._handles = []
