"""Anchor points inside the training step: torch hooks that record a CUDA event (``record``) at cheap places.

Owns :class:`AnchorHooks`: before each top-level block's forward, where each block's backward starts (a
pre-hook on its output's ``grad_fn``), and before each optimizer step; with ``every`` N > 1 only every N-th
block. Top-level blocks: the outermost ``nn.ModuleList`` / ``nn.Sequential`` of at least ``MIN_BLOCKS``
modules under the first module called after :meth:`AnchorHooks.install`, looked for during the first
``DISCOVERY_CALLS`` module calls.

Invariants: hooks decide nothing (anchors that do not fire, or fire out of order, are the controller thread's
to detect); a compiled model (``torch.compile``) gets none; :meth:`AnchorHooks.remove` removes every hook. Why
``grad_fn`` pre-hooks and not ``Tensor.register_hook``: docs/design/controller.md.
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
