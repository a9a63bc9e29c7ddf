"""The report stage of the two-stage benchmarks: figures and Markdown from a run folder (written on the GPU
machine by ``benchmarks.h200.*``), and the layouts of those folders the runs and reports share."""
