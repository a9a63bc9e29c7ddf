"""Typed errors of kdvfs. Every message names the offending input and how to fix it."""

from __future__ import annotations


class KdvfsError(Exception):
    """Base class of every error kdvfs reports to a user (the CLI prints it on one line, exit 2)."""


class TraceFormatError(KdvfsError):
    """A trace file (kdvfs, Kineto or Nsight Compute) is corrupt, truncated, foreign or inconsistent."""


class StepDetectionError(KdvfsError):
    """A profiler recording holds no complete, repeatable training step."""


class ProfileError(KdvfsError):
    """A GPU profile is unknown, malformed, or inconsistent (clocks out of order, missing fields)."""


class UncalibratedError(ProfileError):
    """A cost-model parameter was requested from a profile where it is still a placeholder."""


class UnknownGpuError(ProfileError):
    """No shipped GPU profile lists an installed GPU's NVML device name."""


class DataMissingError(KdvfsError):
    """A folder of shipped data (profiles, presets, configs, traces) is missing or empty: a broken installation."""
