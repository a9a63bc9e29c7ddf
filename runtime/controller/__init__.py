"""The predictive clock controller: applies a plan or frozen policy to matching training steps, safely."""

from runtime.controller.config import ControllerConfig
from runtime.controller.controller import Controller

__all__ = ["Controller", "ControllerConfig"]
