"""The controller as a Hugging Face ``TrainerCallback`` and a PyTorch Lightning ``Callback``.

Neither library is a kdvfs dependency: each is imported when its callback is made. The callbacks open the
controller when training begins, mark a step after every optimizer step, and close it (clocks restored)
when training ends or fails. Lightning calls ``on_exception`` when training fails; Hugging Face's
``Trainer`` has no such hook, so there the callback is also a context manager that closes the controller
however the block ends (a notebook or a hyper-parameter loop that catches the exception finds the GPU
back at its own clocks)::

    with hf_callback(Controller("plan.json", "step.trace.json")) as callback:
        Trainer(..., callbacks=[callback]).train()
    trainer = lightning.Trainer(..., callbacks=[lightning_callback(Controller("plan.json", "step.trace.json"))])

Both callbacks are context managers and have ``on_exception``.
"""

from __future__ import annotations

import types
from typing import Any

from kdvfs.runtime.controller.controller import Controller
from kdvfs.runtime.controller.training.own_process import ProcessController

AnyController = Controller | ProcessController
"""A controller in the training process or in a process of its own: both open, step and close alike."""


class _Steps:
    """The shared logic: open at the start, one ``step()`` per optimizer step, close at the end."""

    def __init__(self, controller: AnyController) -> None:
        self.controller = controller
        self._open = False

    def begin(self) -> None:
        if not self._open:
            self.controller.__enter__()
            self._open = True

    def step(self) -> None:
        if self._open:
            self.controller.step()

    def end(self) -> None:
        if self._open:
            self._open = False
            self.controller.close()


class _Closing:
    """Mixin of both callbacks: ``on_exception`` and the context-manager form close the controller."""

    steps: _Steps

    def on_exception(self, *args: Any, **kwargs: Any) -> None:
        self.steps.end()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: types.TracebackType | None) -> None:
        self.steps.end()


def hf_callback(controller: AnyController, base: type | None = None) -> Any:
    """A ``transformers.TrainerCallback`` driving ``controller`` (``base``: the class to derive from;
    default ``transformers.TrainerCallback``). ``on_step_end`` runs once per optimizer step, after
    gradient accumulation. Use it as a context manager around ``trainer.train()`` (see the module
    docstring): the ``Trainer`` tells no callback that training failed."""
    if base is None:
        from transformers import TrainerCallback

        base = TrainerCallback
    steps = _Steps(controller)

    class KdvfsTrainerCallback(_Closing, base):  # type: ignore[misc, valid-type]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            steps.begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            steps.step()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            steps.end()

    callback = KdvfsTrainerCallback()
    callback.steps = steps
    return callback


def lightning_callback(controller: AnyController, base: type | None = None) -> Any:
    """A Lightning ``Callback`` driving ``controller`` (``base``: default ``lightning.pytorch.Callback``, else
    ``pytorch_lightning.Callback``). A step is marked after the batch that ran the optimizer (every
    ``trainer.accumulate_grad_batches`` batches); an exception closes the controller too."""
    if base is None:
        try:
            from lightning.pytorch import Callback
        except ImportError:
            from pytorch_lightning import Callback
        base = Callback
    steps = _Steps(controller)

    class KdvfsLightningCallback(_Closing, base):  # type: ignore[misc, valid-type]
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            steps.begin()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if (batch_idx + 1) % max(1, int(getattr(trainer, "accumulate_grad_batches", 1))) == 0:
                steps.step()

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            steps.end()

    callback = KdvfsLightningCallback()
    callback.steps = steps
    return callback
