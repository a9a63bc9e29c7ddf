"""kdvfs on a real GPU: the NVML device layer, trace capture, the predictive controller and the CLI."""
