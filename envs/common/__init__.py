"""Shared plumbing of kdvfs: typed errors, strict YAML config loading into frozen dataclasses, atomic and
gzip-transparent file I/O, the locations of shipped files and the run record (command, config, revision, seed)."""
