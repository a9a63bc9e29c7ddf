"""Shared plumbing of kdvfs: typed errors, strict YAML config loading into frozen dataclasses, atomic and
gzip-transparent file I/O, the locations of shipped files, the run record (command, config, revision, seed),
small-array numpy helpers that keep the interpreter lock (``locked``) and the units at kdvfs's edges: ms and
percent to seconds and fractions, with the checks of a typed budget and latency (``units``)."""
