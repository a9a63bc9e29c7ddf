"""Where the GPU is in time: step ends and anchors on the host's time base (the GPU timeline), the torch module
hooks that record the anchors inside each step, whether a step matches the expected one, the step's pace
between its anchors, the anchor map (which kernel each anchor stands for) and the placing of requests on
anchors, and the host times of the expected step's kernels."""
