"""Trace capture from live PyTorch training: ``kdvfs capture`` and the :class:`~runtime.capture.session.Capture`
context manager (imported from ``runtime.capture.session``, which loads torch)."""
