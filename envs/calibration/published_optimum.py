"""The published per-kernel optimum on an RTX 3080 Ti (arXiv 2601.08539, Table 1) and the step it describes.

Table 1 lists the 46 kernels of one GPT-3-XL layer trained with llm.c (seq 1024, batch 40), each with the
clock pair the paper's global 0% optimum chose and that kernel's time and energy change against auto
(``data/raw/public/spaan2026-table1-rtx3080ti.csv``, provenance in ``data/README.md``). The kernels' features
come from the generated GPT-3-XL layer (:func:`paper_layer_config`): llm.c's attention is unfused
(permute, GEMM, softmax, GEMM, unpermute), so the layer is generated with unfused attention, and each
Table 1 kernel takes the generated kernel doing the same work (:data:`GENERATED_KERNELS`; TensorIterator
pieces of one op are merged into one kernel).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

from kdvfs.common.files import read_input
from kdvfs.common.paths import RAW_DATA_DIR
from kdvfs.envs.calibration.sweep import SweepError
from kdvfs.envs.gpu.profiles import GpuProfile
from kdvfs.envs.synthetic.generator import TransformerConfig, generate_transformer_trace, load_workload
from kdvfs.envs.trace.trace import Kernel, Trace, TraceMeta

TABLE1_PATH = RAW_DATA_DIR / "public" / "spaan2026-table1-rtx3080ti.csv"
COLUMNS = ("index", "kernel", "section", "mem_mhz", "core_mhz", "time_pct", "energy_pct")
SECTIONS = ("embedding", "forward", "loss", "backward", "embedding backward")
FIT_SECTIONS = ("embedding", "forward", "loss")
"""The part of Table 1 the ``rtx3080ti`` profile is fitted on (kernels 0-18); the rest is held out."""
GENERATED_KERNELS = (
    "embedding_fwd_tokens", "layer_norm_fwd", "gemm_qkv_fwd", "copy_contiguous_q", "gemm_scores_fwd",
    "softmax_scores_fwd", "gemm_context_fwd", "copy_contiguous_context", "gemm_proj_fwd", "add_residual",
    "gemm_fc1_fwd", "gelu_fwd", "gemm_fc2_fwd", "add_residual", "gemm_lm_head_fwd", "log_softmax_fwd",
    "gemm_lm_head_dgrad", "gemm_lm_head_wgrad", "layer_norm_bwd_input", "gelu_fwd", "reduce_fc2_bias_grad",
    "reduce_fc2_bias_grad", "gemm_fc2_dgrad", "gelu_bwd", "gemm_fc2_wgrad", "reduce_fc1_bias_grad",
    "gemm_fc1_dgrad", "gemm_fc1_wgrad", "layer_norm_bwd_input", "reduce_proj_bias_grad", "reduce_proj_bias_grad",
    "gemm_proj_dgrad", "gemm_proj_wgrad", "copy_contiguous_context_grad", "gemm_probs_grad", "gemm_value_grad",
    "softmax_scores_bwd", "gemm_query_grad", "gemm_key_grad", "cat_qkv_grad", "reduce_qkv_bias_grad",
    "gemm_qkv_dgrad", "gemm_qkv_wgrad", "layer_norm_bwd_input", "embedding_bwd_feature",
    "embedding_bwd_compute_grad_weight",
)
"""For each Table 1 kernel (by index), the generated kernel (``synthetic::<name>``) whose features it takes.

Residual adds take the forward residual; llm.c's GELU recompute in the backward and its bias-gradient
reduce take the forward GELU and the bias column sum; the backward permutes take the context-gradient
copy and the q/k/v gradient concatenation; WPE/WTE backward the direct and the segment-sum kernels."""


@dataclass(frozen=True)
class PublishedKernel:
    """One row of Table 1: a kernel, the clock pair chosen for it (None: auto) and its changes vs auto (%)."""

    index: int
    kernel: str
    section: str
    mem_mhz: int | None
    core_mhz: int | None
    time_pct: float
    energy_pct: float

    @property
    def fitted(self) -> bool:
        """True for the kernels the profile is fitted on (:data:`FIT_SECTIONS`)."""
        return self.section in FIT_SECTIONS

    @property
    def is_gemm(self) -> bool:
        return self.kernel == "GEMM"


HIGH_MEMORY_FRACTION = 0.95
CORE_DOWN_FRACTION = 0.95


def choice_kind(core_mhz: float | None, mem_mhz: float, auto_core_mhz: float, default_mem_mhz: float) -> str:
    """What a clock choice does: ``"memory down"`` (memory below the default, core not locked below 95% of
    the kernel's auto clock), ``"core down"`` (core below that, memory within 5% of the default), ``"both"``
    or ``"neither"``. ``core_mhz`` None is auto."""
    core_down = core_mhz is not None and core_mhz < CORE_DOWN_FRACTION * auto_core_mhz
    if core_down:
        return "core down" if mem_mhz >= HIGH_MEMORY_FRACTION * default_mem_mhz else "both"
    return "memory down" if mem_mhz < default_mem_mhz else "neither"


def paper_kind(row: PublishedKernel) -> str:
    """The paper's finding for the row's class: memory down for GEMMs, core down for memory-bound kernels."""
    return "memory down" if row.is_gemm else "core down"


def _clock(text: str, where: str) -> int | None:
    if text == "auto":
        return None
    if not text.isdigit() or int(text) <= 0:
        raise SweepError(f"{where}: clock {text!r} must be a positive integer in MHz or 'auto'")
    return int(text)


def _row(raw: dict[str, str], where: str) -> PublishedKernel:
    if raw["section"] not in SECTIONS:
        raise SweepError(f"{where}: section {raw['section']!r} is not one of {list(SECTIONS)}")
    try:
        index, time_pct, energy_pct = int(raw["index"]), float(raw["time_pct"]), float(raw["energy_pct"])
    except ValueError:
        raise SweepError(f"{where}: index, time_pct and energy_pct must be numbers") from None
    return PublishedKernel(index, raw["kernel"], raw["section"], _clock(raw["mem_mhz"], where),
                           _clock(raw["core_mhz"], where), time_pct, energy_pct)


def load_published_optimum(path: Path = TABLE1_PATH) -> tuple[PublishedKernel, ...]:
    """Table 1 as rows, strictly: the columns of :data:`COLUMNS`, indices 0..45 in order."""
    reader = csv.DictReader(read_input(path, SweepError).splitlines())
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise SweepError(f"{path}: columns {reader.fieldnames} must be {list(COLUMNS)}")
    rows = tuple(_row(raw, f"{path}: line {line + 2}") for line, raw in enumerate(reader))
    if [r.index for r in rows] != list(range(len(GENERATED_KERNELS))):
        raise SweepError(f"{path}: expected kernels 0..{len(GENERATED_KERNELS) - 1} in order")
    return rows


def paper_layer_config() -> TransformerConfig:
    """The paper's workload: one GPT-3-XL layer, seq 1024, batch 40, unfused attention as in llm.c."""
    return replace(load_workload("gpt3xl"), name="gpt3xl-1layer-s1024-b40-unfused", layers=1, seq=1024,
                   batch=40, fused=False)


def _merged_kernels(trace: Trace) -> dict[str, Kernel]:
    """The first kernel of each generated name, with the pieces launched right after it for the same op."""
    merged: dict[str, Kernel] = {}
    kernels = trace.kernels
    start = 0
    while start < len(kernels):
        end = start + 1
        while end < len(kernels) and kernels[end].name == kernels[start].name:
            end += 1
        name = kernels[start].name.removeprefix("synthetic::")
        merged.setdefault(name, replace(kernels[start], duration_s=sum(k.duration_s for k in kernels[start:end])))
        start = end
    return merged


def table1_step(profile: GpuProfile) -> Trace:
    """The 46 Table 1 kernels in the paper's order as one step, each with its generated kernel's features."""
    generated = generate_transformer_trace(paper_layer_config(), profile)
    merged = _merged_kernels(generated)
    meta = TraceMeta(gpu=generated.meta.gpu, workload="spaan2026-table1", source=f"Table 1 of arXiv 2601.08539 "
                     f"priced as {generated.meta.source}", ref_mem_mhz=generated.meta.ref_mem_mhz)
    return Trace(meta=meta, kernels=tuple(merged[name] for name in GENERATED_KERNELS))
