"""Benchmarks on a real GPU (an H200): dry runs only, NVML through ``benchmarks.common.nvml_guard``, which refuses
every state-changing call; a ``run`` stage on the GPU machine and a ``report`` stage anywhere."""
