"""The predictive clock controller: applies a plan or frozen policy to matching training steps, safely."""

from kdvfs.runtime.controller.config import ControllerConfig
from kdvfs.runtime.controller.controller import Controller

__all__ = ["Controller", "ControllerConfig"]
