"""Benchmarks of the runtime on the fake GPU and fake NVML (``kdvfs.runtime.testing``): the controller, the A/B
measurement and the daemon against a known truth, on any machine."""
