"""``kdvfs daemon``: clock control without root. A small privileged service that owns the NVML clock calls of
a machine's GPUs (``server``: the socket, its threads, signals, the request log; ``connections``: their
limits, the client process watched, request lines read within limits; ``gpu_table``: who holds each GPU, its
locks and resets, the state file that outlives a crash), the narrow JSON-lines request set it accepts
(``protocol``), and the client side (``client``: ``DaemonDevice``, the same ``Device`` interface over the
socket, which a command uses only when ``--daemon`` or ``KDVFS_DAEMON`` names the socket). It changes
clocks only through ``runtime/device``'s ``NvmlDevice`` and holds each leased GPU's ``GpuLease``."""
