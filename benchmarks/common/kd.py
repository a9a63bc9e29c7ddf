"""The kdvfs command for machines where kdvfs is on PYTHONPATH but not installed:
``python3 -m benchmarks.common.kd ARGS`` from the repository root."""
import sys

from kdvfs.runtime.cli import main

sys.exit(main(sys.argv[1:]))
