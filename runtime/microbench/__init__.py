"""``kdvfs calibrate``: microbenchmarks on the installed GPU, their measurement through NVML, and the fit of a
GPU profile (read-only at default clocks, or over a locked clock grid with ``--sweep``)."""
