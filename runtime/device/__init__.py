"""The NVML device layer: read-only GPU queries, typed device errors and profile skeletons."""
