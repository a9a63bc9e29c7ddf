"""Kernel traces of one training step: the typed record (``trace``), its file format, import from the PyTorch
profiler (Kineto) and Nsight Compute, kernel classification, the bundled traces and summaries."""
