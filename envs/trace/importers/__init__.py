"""Profiler-recording importers, one module per file format; each registers its reader by format name with
:func:`kdvfs.envs.trace.importing.register_importer`, and every module here is found by
:func:`kdvfs.envs.trace.importing.importer_formats`."""
