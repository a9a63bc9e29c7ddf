"""Typed device errors, and the one place where NVML's vendor errors become kdvfs errors."""

from __future__ import annotations

import pynvml

from kdvfs.common.errors import KdvfsError


class DeviceError(KdvfsError):
    """An NVML call failed; base class of every device error."""


class NvmlUnavailableError(DeviceError):
    """No NVIDIA driver or no ``libnvidia-ml`` on this machine."""


class NvmlPermissionError(DeviceError):
    """The call needs root or ``CAP_SYS_ADMIN`` (setting clocks or power limits)."""


class NvmlNotSupportedError(DeviceError):
    """This GPU or driver does not support the query."""


class DriverTooOldError(DeviceError):
    """The installed driver lacks an NVML function or structure version kdvfs uses."""


class DeviceIndexError(DeviceError):
    """A GPU index (or another NVML argument) is out of range."""


class UnsupportedClockError(DeviceError):
    """A requested SM or memory clock is not one this GPU supports."""


class ClockRestoreError(DeviceError):
    """Returning a GPU's clocks to its own control failed: the GPU may still be at locked clocks.

    Attributes:
        where: the GPU as the message names it; failures: the NVML errors, one per failed reset.
    """

    where: str = ""
    failures: list[str] = []  # noqa: RUF012 (set per instance by restore_error)


_TRANSLATIONS: dict[int, tuple[type[DeviceError], str]] = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (
        NvmlUnavailableError,
        "install the NVIDIA driver (it provides libnvidia-ml.so.1) or run on a machine with an NVIDIA GPU"),
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: (
        NvmlUnavailableError,
        "load the NVIDIA driver (check that `nvidia-smi` works) or run on a machine with an NVIDIA GPU"),
    pynvml.NVML_ERROR_NO_PERMISSION: (
        NvmlPermissionError, "run as root or give the process CAP_SYS_ADMIN"),
    pynvml.NVML_ERROR_NOT_SUPPORTED: (
        NvmlNotSupportedError, "this GPU or driver does not offer it; use a GPU and driver that do"),
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: (
        DriverTooOldError, "the NVIDIA driver is too old for this NVML function; upgrade the driver"),
    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH: (
        DriverTooOldError, "the NVIDIA driver is too old for this NVML struct version; upgrade the driver"),
    pynvml.NVML_ERROR_INVALID_ARGUMENT: (
        DeviceIndexError, "check the GPU index against `kdvfs gpus local` or `nvidia-smi -L`"),
}


# NVML codes meaning "this optional fact is not offered here" (a full H200 answers NOT_SUPPORTED for
# nvmlDeviceGetAttributes; an old driver lacks the function).
_ABSENT_CODES = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})

_CLOCK_REQUEST_INVALID = (
    UnsupportedClockError, "request a clock pair this GPU lists (`kdvfs gpus local`), e.g. a plan or policy made "
    "for this GPU's profile")


def translate_nvml_error(error: pynvml.NVMLError, action: str, clock_request: bool = False) -> KdvfsError:
    """The kdvfs error for an NVML error raised while doing ``action`` (e.g. "read the power limit of GPU 0").

    The message is one line naming the action, NVML's own words and the fix. With ``clock_request`` (a clock
    lock), an invalid argument is an unsupported clock rather than a bad GPU index.
    """
    code = int(error.value)
    kind: type[DeviceError]
    if clock_request and code == pynvml.NVML_ERROR_INVALID_ARGUMENT:
        kind, fix = _CLOCK_REQUEST_INVALID
    else:
        kind, fix = _TRANSLATIONS.get(code, (DeviceError, "check the GPU and driver state with `nvidia-smi`"))
    return kind(f"cannot {action}: {error} (NVML error {code}); {fix}")


def is_absent(error: pynvml.NVMLError) -> bool:
    """True when NVML's error means that this GPU or driver does not offer an optional fact."""
    return int(error.value) in _ABSENT_CODES


def observe_only_reason(error: BaseException | None) -> str | None:
    """Why a run can only observe from ``error`` on: the GPU refuses clock setting (no permission, not
    supported), so it stays at auto while training goes on; None for any other error (or none)."""
    return str(error) if isinstance(error, NvmlPermissionError | NvmlNotSupportedError) else None
