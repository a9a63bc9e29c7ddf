"""The observation: its spec and blocks, the one function that writes it at a state (``live_tables.observe_at``),
the state a controller measures (``live``) and the residual design's measured observation (``measured``)."""
