"""The predictive clock controller: applies a plan or frozen policy to matching training steps, safely.

The public API is :class:`Controller` (with its :class:`ControllerConfig`) and the training-loop callbacks
:func:`hf_callback` and :func:`lightning_callback`. The controller's work is split in rooms, one concern each:
``training`` (the training process's side: ``kdvfs run``'s launch, its bootstrap, the module hooks, the
callbacks), ``timing`` (the GPU timeline, step matching, the step's pace and anchors), ``measurement`` (A/B
windows, estimator, accounting, guard, budget feedback, job summary) and ``decisions`` (the plan or policy, the
step sources, the issuer thread and the actuator).
"""

from kdvfs.runtime.controller.config import ControllerConfig
from kdvfs.runtime.controller.controller import Controller
from kdvfs.runtime.controller.training.integrations import hf_callback, lightning_callback

__all__ = ["Controller", "ControllerConfig", "hf_callback", "lightning_callback"]
