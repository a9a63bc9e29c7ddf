"""The predictive clock controller: applies a plan or frozen policy to matching training steps, safely.

The public API is :class:`Controller` (with its :class:`ControllerConfig`; :class:`ProcessController`: the same
controller in a process of its own, experimental) and the training-loop callbacks :func:`hf_callback` and
:func:`lightning_callback`. The controller's rooms are layers, each importing only from
those below it: ``config``/``event_log``, ``model`` (plans, step plans, requests), ``timing``, ``measurement``,
``decisions``, ``shapes``, ``control`` (opening the GPU, the issuer thread, the summary), ``controller``,
``training`` (``kdvfs run``'s launch and bootstrap, the callbacks); docs/design/controller.md.
"""

from kdvfs.runtime.controller.config import ControllerConfig
from kdvfs.runtime.controller.controller import Controller
from kdvfs.runtime.controller.training.integrations import hf_callback, lightning_callback
from kdvfs.runtime.controller.training.own_process import ProcessController

__all__ = ["Controller", "ControllerConfig", "ProcessController", "hf_callback", "lightning_callback"]
