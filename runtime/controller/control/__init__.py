"""The controller's assembled parts, above every other room but ``training``: the background thread that
follows the GPU step by step and runs the step source through the controlled steps (``issuer``)."""
