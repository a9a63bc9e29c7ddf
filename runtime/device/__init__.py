"""The device layer: one GPU interface (``interface.Device``) over NVML (``clock_control.NvmlDevice``, read-only
queries in ``nvml_info``) and its cost-model fake (``fake.FakeGpu``), typed device errors, energy windows and
profile skeletons."""
