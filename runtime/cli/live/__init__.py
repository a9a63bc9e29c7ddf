"""Commands that run a training script or talk to a GPU: capture, calibration, the clock controller and its report,
and the clock reset (``kdvfs capture | calibrate | run | report | reset``)."""
