"""The controller's parts, above every room but ``training``: opening and checking the GPU, its lease and
watchdog (``opening``), wiring the thread's parts (``assembly``), the background thread that follows the GPU
step by step and runs the step source through the controlled steps (``issuer``), and the run's summary
(``summary``)."""
