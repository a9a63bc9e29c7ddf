"""The pieces :mod:`kdvfs.envs.synthetic.kernels` builds a training step's kernel list from: the launch
constants of the PyTorch/cuBLAS/ATen code paths it mirrors, the efficiency classes (:class:`Eff`), one kernel's
work before pricing (:class:`Spec`), and :class:`KernelBuilder`, which appends specs in launch order.
FLOPs count multiply-adds as 2; bytes are compulsory DRAM traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from kdvfs.envs.synthetic.workload import TransformerConfig
from kdvfs.envs.trace.trace import Category, Kind, OpInfo, Phase

CHUNK_ELEMENTS = 65536  # multi_tensor_apply chunk size (elements), ATen MultiTensorApply.cuh
MAX_BLOCKS_PER_LAUNCH = 320  # multi_tensor_apply blocks (chunks) per launch
MAX_TENSORS_BY_DEPTH = (110, 64, 48, 36, 30)  # multi_tensor_apply tensors per launch for 1..5 tensor lists
MEMSET_MIN_OUTPUT = 2**23  # cuBLAS GEMMs with at least this many output elements get a workspace memset
SPLITK_MAX_OUTPUT = 2**22  # weight-gradient GEMMs below this output size with K >= 4 max(M, N) use split-K
SPLITK_SLICES = 4  # split-K partial products summed by the separate splitKreduce kernel
INT32_INDEX_BYTES = 2**31  # TensorIterator halves an elementwise op until every operand is below this
MEMSET_BYTES = 4096.0  # nominal size of a workspace/semaphore memset (bytes)


class Eff(StrEnum):
    """Efficiency class of a kernel: which achievable-throughput constants price it (see ``generator``)."""

    GEMM = "gemm"
    FLASH_FWD = "flash_fwd"
    FLASH_BWD = "flash_bwd"
    ATTN_AUX = "attn_aux"
    VECTOR = "vector"
    CAST_UP = "cast_up"
    MIXED = "mixed"
    ACTIVATION = "activation"
    NORM = "norm"
    SOFTMAX = "softmax"
    REDUCE = "reduce"
    GATHER = "gather"
    SEGMENT = "segment"
    SORT = "sort"
    SERIAL = "serial"
    TINY = "tiny"
    OPTIMIZER = "optimizer"
    MEMSET = "memset"


@dataclass(frozen=True)
class Spec:
    """One activity before pricing: identity, work (FLOPs, DRAM bytes) and efficiency class."""

    name: str
    kind: Kind
    category: Category
    phase: Phase
    op: OpInfo
    flops: float
    dram_bytes: float
    eff: Eff
    tensor: bool
    host_sync: bool = False


def index_splits(largest_operand_bytes: float) -> int:
    """Kernels TensorIterator launches for one elementwise op (it halves ops with 32-bit-unsafe offsets)."""
    if largest_operand_bytes < INT32_INDEX_BYTES:
        return 1
    return 2 ** math.ceil(math.log2(largest_operand_bytes / INT32_INDEX_BYTES))


def multi_tensor_launches(numels: list[int], depth: int) -> list[int]:
    """Elements processed by each launch of ``multi_tensor_apply`` over tensors of these sizes."""
    max_tensors = MAX_TENSORS_BY_DEPTH[depth - 1]
    launches: list[int] = []
    blocks = tensors = elements = 0
    for index, numel in enumerate(numels):
        n_chunks, chunk = math.ceil(numel / CHUNK_ELEMENTS), 0
        tensors += 1
        while chunk < n_chunks:
            take = min(MAX_BLOCKS_PER_LAUNCH - blocks, n_chunks - chunk)
            elements += min(numel, (chunk + take) * CHUNK_ELEMENTS) - chunk * CHUNK_ELEMENTS
            blocks, chunk = blocks + take, chunk + take
            tensor_done = chunk == n_chunks
            if (blocks == MAX_BLOCKS_PER_LAUNCH or (tensor_done and tensors == max_tensors)
                    or (tensor_done and index == len(numels) - 1)):
                launches.append(elements)
                blocks = elements = 0
                tensors = 0 if tensor_done else 1
    return launches


def param_numels(config: TransformerConfig) -> list[int]:
    """Parameter tensor sizes in ``model.parameters()`` order (untied LM head, learned positions; a mixture of
    experts has a bias-free router and per-expert MLPs in place of the dense MLP)."""
    d, f = config.d_model, config.ffn
    mlp = [f * d, f, d * f, d]
    if config.experts:
        mlp = [config.experts * d, *(mlp * config.experts)]
    layer = [d, d, 3 * d * d, 3 * d, d * d, d, d, d, *mlp]
    return [config.vocab * d, config.seq * d, *(layer * config.layers), d, d, config.vocab * d]


@dataclass
class KernelBuilder:
    """Appends specs in launch order; helpers mirror the PyTorch ops that launch them."""

    config: TransformerConfig
    specs: list[Spec] = field(default_factory=list)
    phase: Phase = Phase.FORWARD
    autocast: bool = field(init=False)
    act: int = field(init=False)  # bytes per element of the compute dtype
    tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.autocast = self.config.precision != "fp32"
        self.act = 2 if self.autocast else 4
        self.tokens = self.config.batch * self.config.seq

    def add(self, name: str, op: str, dims: tuple[tuple[int, ...], ...], category: Category, eff: Eff,
            flops: float = 0.0, nbytes: float = 0.0, tensor: bool = False) -> None:
        self.specs.append(Spec(f"synthetic::{name}", Kind.KERNEL, category, self.phase, OpInfo(f"aten::{op}", dims),
                               float(flops), float(nbytes), eff, tensor))

    def memset(self, op: str, dims: tuple[tuple[int, ...], ...]) -> None:
        self.specs.append(Spec("synthetic::memset_workspace", Kind.MEMSET, Category.COPY_MEMSET, self.phase,
                               OpInfo(f"aten::{op}", dims), 0.0, MEMSET_BYTES, Eff.MEMSET, False))

    def host_sync(self, op: str, nbytes: float) -> None:
        """A device-to-host copy the CPU waits for (``nonzero``, ``.tolist()``): the next launch comes late."""
        self.specs.append(Spec("synthetic::memcpy_dtoh", Kind.MEMCPY, Category.COPY_MEMSET, self.phase,
                               OpInfo(f"aten::{op}", ()), 0.0, float(nbytes), Eff.TINY, False, host_sync=True))

    def pointwise(self, name: str, op: str, shape: tuple[int, ...], category: Category, eff: Eff,
                  bytes_per_element: float, widest: int = 4, flops_per_element: float = 0.0) -> None:
        """An elementwise op over ``shape``; split like TensorIterator when its widest operand is huge."""
        n = math.prod(shape)
        pieces = index_splits(n * widest)
        for _ in range(pieces):
            self.add(name, op, (shape, shape), category, eff, n * flops_per_element / pieces,
                     n * bytes_per_element / pieces)

    def cast(self, name: str, shape: tuple[int, ...], to_fp32: bool) -> None:
        """An autocast dtype copy: fp32 -> compute dtype (vectorized) or back (unrolled, slower); none in fp32."""
        if self.autocast:
            eff = Eff.CAST_UP if to_fp32 else Eff.VECTOR
            self.pointwise(f"copy_cast_{name}", "copy_", shape, Category.COPY_MEMSET, eff, 4 + self.act)

    def gemm(self, name: str, op: str, dims: tuple[tuple[int, ...], ...], mnk: tuple[int, int, int],
             batch: int = 1, bias: bool = False, wgrad: bool = False) -> None:
        """A cuBLAS GEMM (M x K) @ (K x N), with its workspace memset or split-K reduction."""
        m, n, k = mnk
        split_k = wgrad and m * n < SPLITK_MAX_OUTPUT and k >= 4 * max(m, n)
        if batch * m * n >= MEMSET_MIN_OUTPUT and not split_k:
            self.memset(op, dims)
        nbytes = batch * (m * k + k * n + m * n) * self.act + (n * self.act if bias else 0)
        self.add(f"gemm_{name}", op, dims, Category.GEMM, Eff.GEMM, 2.0 * batch * m * n * k, nbytes, self.autocast)
        if split_k:
            self.add(f"gemm_{name}_splitkreduce", op, dims, Category.GEMM, Eff.VECTOR, m * n * SPLITK_SLICES,
                     m * n * (4 * SPLITK_SLICES + self.act))
