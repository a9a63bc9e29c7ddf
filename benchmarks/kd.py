"""The kdvfs command for machines where kdvfs is on PYTHONPATH but not installed: ``python3 benchmarks/kd.py ARGS``."""
import sys

from kdvfs.runtime.cli import main

sys.exit(main(sys.argv[1:]))
