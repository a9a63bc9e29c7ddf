"""Calibrating the cost model: measurement sweeps in one schema, converters from published and bundled
measurements, the least-squares fit of a profile's parameters and k-fold validation."""
