"""CPU test mode: turn a CPU-only profiler recording into one shaped like a GPU recording.

A training step on the CPU launches no kernels, so ``kdvfs capture --cpu-test-mode`` lets CPU ops stand in
for them: each outermost ATen op that does work (not a view, allocation or composite wrapper) becomes one
"kernel" event with the op's timing and a link (``External id``) to the op and its shapes. Ops run by the
autograd engine (inside ``autograd::engine::evaluate_function``) are moved to a separate thread, as the
autograd engine's device thread launches backward kernels on a GPU. Gloo collectives (a DDP job on the
CPU: the ``gloo:*`` annotations of gloo's worker threads, e.g. ``gloo:all_reduce``) become communication
"kernels" on a stream of their own, as NCCL kernels run on their own stream. The result goes through the same
step detection, phase labelling and classification as a real GPU recording. It is an approximation for
tests and dry runs on machines without a GPU, never a source of time or energy figures.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from kdvfs.common.files import read_text, write_text_atomic

TRANSPARENT_OPS = frozenset(f"aten::{name}" for name in (
    # views, metadata and allocations: no kernel on a GPU
    "empty", "empty_strided", "empty_like", "view", "_unsafe_view", "as_strided", "t", "transpose", "permute",
    "expand", "expand_as", "reshape", "_reshape_alias", "detach", "alias", "unsqueeze", "squeeze", "select",
    "slice", "narrow", "split", "split_with_sizes", "chunk", "unbind", "view_as", "lift_fresh", "resolve_conj",
    "resolve_neg", "result_type", "set_", "flatten", "numpy_T", "contiguous", "is_nonzero",
    # composites whose work is done by the ops they call
    "linear", "matmul", "to", "_to_copy", "square", "dropout", "cross_entropy_loss", "log_softmax", "nll_loss",
    "nll_loss_nd", "layer_norm", "group_norm", "batch_norm", "_batch_norm_impl_index", "conv2d", "convolution",
    "_convolution", "scaled_dot_product_attention", "embedding", "adaptive_avg_pool2d", "max_pool2d",
))
AUTOGRAD_PREFIX = "autograd::engine::evaluate_function"
EMULATED_GPU = "CPU (ops emulating kernels)"
GLOO_PREFIX = "gloo:"
COMMUNICATION_STREAM = "stream 1 (communication)"


def _is_kernel_op(name: str) -> bool:
    return name.startswith("aten::") and name not in TRANSPARENT_OPS


def _mark_thread(ops: list[dict[str, Any]]) -> list[tuple[dict[str, Any], bool]]:
    """Ops of one thread that become kernels, each with whether the autograd engine ran it."""
    chosen = []
    stack: list[tuple[float, bool, bool]] = []  # (end_us, inside a kernel op, inside autograd)
    for op in sorted(ops, key=lambda e: (float(e["ts"]), -float(e["dur"]))):
        start, end = float(op["ts"]), float(op["ts"]) + float(op["dur"])
        while stack and stack[-1][0] <= start:
            stack.pop()
        in_kernel, in_autograd = (stack[-1][1], stack[-1][2]) if stack else (False, False)
        name = str(op.get("name", ""))
        is_kernel = not in_kernel and _is_kernel_op(name)
        if is_kernel:
            chosen.append((op, in_autograd))
        stack.append((end, in_kernel or is_kernel, in_autograd or name.startswith(AUTOGRAD_PREFIX)))
    return chosen


def _kernel_event(op: dict[str, Any], stream: str = "stream 0") -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": op["name"], "pid": "emulated-gpu", "tid": stream,
            "ts": op["ts"], "dur": op["dur"],
            "args": {"External id": (op.get("args") or {}).get("External id"), "device": 0,
                     "grid": [1, 1, 1], "block": [1, 1, 1]}}


def emulate_gpu_recording(source: Path, target: Path) -> int:
    """Write ``target``: the chrome trace ``source`` with CPU ops standing in for kernels. Returns their count."""
    document = json.loads(read_text(Path(source)))
    by_thread: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for event in document.get("traceEvents", []):
        if isinstance(event, dict) and event.get("ph") == "X" and event.get("cat") == "cpu_op":
            by_thread[event.get("tid")].append(event)
    kernels = []
    for tid, ops in by_thread.items():
        for op, in_autograd in _mark_thread(ops):
            if in_autograd:
                op["tid"] = f"{tid} (autograd)"
            kernels.append(_kernel_event(op))
    kernels += [_kernel_event(event, COMMUNICATION_STREAM) for event in document.get("traceEvents", [])
                if isinstance(event, dict) and event.get("ph") == "X" and event.get("cat") == "user_annotation"
                and str(event.get("name", "")).startswith(GLOO_PREFIX)]
    document["traceEvents"] = [*document.get("traceEvents", []), *kernels]
    document["deviceProperties"] = [{"name": EMULATED_GPU}]
    write_text_atomic(Path(target), json.dumps(document))
    return len(kernels)
