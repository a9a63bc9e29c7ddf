"""What every benchmark shares: the provenance block and results files, the kdvfs command without an install,
and the refusing NVML guard for dry runs on a real GPU."""
