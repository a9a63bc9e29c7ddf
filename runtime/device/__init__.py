"""The device layer: one GPU interface (``interface.Device``), NVML (``nvml_device``: ``GpuReader`` reads it,
``NvmlDevice`` also sets clocks), typed device errors (``errors``, the one place NVML's errors are mapped),
host time (``host_time``), energy windows (``energy``) and profile skeletons (``profile_skeleton``)."""
