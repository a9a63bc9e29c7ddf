"""Shared plumbing of kdvfs: typed errors, strict YAML config loading into frozen dataclasses, atomic and
gzip-transparent file I/O, the locations of shipped files, the run record (command, config, revision, seed)
and small-array numpy helpers that keep the interpreter lock (``locked``)."""
