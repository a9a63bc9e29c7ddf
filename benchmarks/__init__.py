"""kdvfs's benchmarks: each writes ``benchmarks/results/<name>.{json,md}`` with its provenance; ``docs/results.md``
lists the claims they back. Run from the repository root as ``python -m benchmarks.ROOM.NAME``.

Rooms by what they measure: ``h200`` (a real GPU, dry runs only), ``fake_gpu`` (the runtime on the fake GPU and
fake NVML), ``model`` (the cost model and planners, CPU only), ``learned`` (the learned policies, CPU only);
``reports`` renders a two-stage benchmark's figures from its run folder; ``common`` holds what they share
(provenance, the guarded NVML, the kdvfs command). Rooms import ``common`` and ``reports``, never the reverse;
no kdvfs package imports ``benchmarks``.
"""
