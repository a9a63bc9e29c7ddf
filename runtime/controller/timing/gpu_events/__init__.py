"""The GPU's events without the interpreter lock: the CUDA driver's event calls (:mod:`.driver`), the board the
training threads record marks and anchors on and a native thread fills with the times the GPU passed them
(:mod:`.board`, shared with a controller in a process of its own), that thread (:mod:`.poller`) and the recorder the
training threads call (:mod:`.recorder`). Design: docs/design/controller.md (Threads)."""
