"""Trace capture from live PyTorch training: ``kdvfs capture`` and the :class:`~kdvfs.runtime.capture.session.Capture`
context manager (imported from ``kdvfs.runtime.capture.session``, which loads torch)."""
