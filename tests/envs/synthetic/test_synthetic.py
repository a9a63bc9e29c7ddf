"""Synthetic transformer traces: structure, scaling, seeded noise, bad configs, and agreement with H200 traces."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from kdvfs.common.config import ConfigError
from kdvfs.common.errors import KdvfsError, StepDetectionError
from kdvfs.envs.gpu.profiles import GpuProfile, load_profile
from kdvfs.envs.synthetic.generator import (
    NOISE_SIGMA,
    available_workloads,
    generate_transformer_trace,
    layer_kernel_counts,
    load_workload,
)
from kdvfs.envs.synthetic.kernel_builder import multi_tensor_launches, param_numels
from kdvfs.envs.synthetic.workload import TransformerConfig
from kdvfs.envs.trace.bundled import open_trace
from kdvfs.envs.trace.classify import classify
from kdvfs.envs.trace.format import load_trace, save_trace
from kdvfs.envs.trace.trace import Category, Kind, Phase, Trace

PHASE_ORDER = {Phase.FORWARD: 0, Phase.BACKWARD: 1, Phase.OPTIMIZER: 2}
TOLERANCE = 0.25


@pytest.fixture(scope="module")
def h200() -> GpuProfile:
    return load_profile("h200")


def small(**changes: object) -> TransformerConfig:
    """A 4-layer GPT small enough to generate in milliseconds."""
    base = TransformerConfig(name="tiny", layers=4, d_model=256, heads=4, ffn=1024, seq=128, batch=2, vocab=1024)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


VARIANTS = [small(), small(fused=False), small(precision="fp16"), small(precision="fp32"), small(decoder=False),
            small(experts=4, top_k=2)]


def test_presets_load_and_gpt3xl_matches_its_definition() -> None:
    assert {"gpt3xl", "gpt2s"} <= set(available_workloads())
    assert len(available_workloads()) >= 4
    for name in available_workloads():
        assert load_workload(name).name == name
    gpt3xl = load_workload("gpt3xl")
    assert (gpt3xl.layers, gpt3xl.d_model, gpt3xl.heads, gpt3xl.ffn, gpt3xl.seq, gpt3xl.batch, gpt3xl.vocab) == \
        (24, 2048, 16, 8192, 2048, 4, 50304)
    assert (gpt3xl.precision, gpt3xl.fused, gpt3xl.decoder) == ("bf16", True, True)


@pytest.mark.parametrize("config", VARIANTS, ids=lambda c: c.summary())
def test_structure(config: TransformerConfig, h200: GpuProfile) -> None:
    trace = generate_transformer_trace(config, h200)
    phases = [PHASE_ORDER[k.phase] for k in trace.kernels]
    assert phases == sorted(phases) and set(phases) == {0, 1, 2}
    for k in trace.kernels:
        assert k.dram_bytes is not None and k.dram_bytes > 0
        assert k.flops is not None and k.flops >= 0
        assert k.gap_before_s > 0 and k.name.startswith("synthetic::")
        assert k.features is not None and k.features.source == "synthetic" and k.features.clock_mhz is None
        for value in (k.features.sm_util, k.features.dram_util, k.features.tensor_util):
            assert value is not None and 0.0 <= value <= 1.0
        assert classify(k.name, k.op.name if k.op else None, k.kind, k.phase is Phase.OPTIMIZER) is k.category
    gemms = [k for k in trace.kernels if k.category is Category.GEMM and "splitkreduce" not in k.name]
    assert gemms and all(k.flops and k.flops > 0 for k in gemms)
    tensor_utils = [k.features.tensor_util for k in gemms if k.features is not None]
    assert all((util is not None and util > 0) == (config.precision != "fp32") for util in tensor_utils)
    assert trace.meta.gpu == h200.model and trace.meta.workload == config.name
    assert trace.meta.source.startswith("synthetic:") and trace.meta.ref_core_mhz is None
    assert trace.meta.ref_mem_mhz == h200.clocks.default_memory_mhz


@pytest.mark.parametrize("config", VARIANTS, ids=lambda c: c.summary())
def test_more_layers_and_larger_batch_cost_more(config: TransformerConfig, h200: GpuProfile) -> None:
    base = generate_transformer_trace(config, h200)
    deeper = generate_transformer_trace(dataclasses.replace(config, layers=2 * config.layers), h200)
    wider = generate_transformer_trace(dataclasses.replace(config, batch=2 * config.batch), h200)
    assert deeper.count(Kind.KERNEL) > base.count(Kind.KERNEL) and deeper.step_time_s > base.step_time_s
    assert wider.step_time_s > base.step_time_s
    per_layer, _ = layer_kernel_counts(base, config.layers)
    assert layer_kernel_counts(deeper, 2 * config.layers)[0] == per_layer
    assert deeper.count(Kind.KERNEL) - base.count(Kind.KERNEL) >= per_layer * config.layers


def test_optimizer_launches_scale_with_parameters(h200: GpuProfile) -> None:
    def adamw_launches(trace: Trace) -> int:
        return sum(1 for k in trace.kernels if k.op is not None and k.op.name == "aten::_fused_adamw_")

    config = load_workload("gpt2s")
    assert adamw_launches(generate_transformer_trace(config, h200)) == \
        len(multi_tensor_launches(param_numels(config), 4)) > 1
    deeper = dataclasses.replace(config, layers=4 * config.layers)
    assert adamw_launches(generate_transformer_trace(deeper, h200)) > \
        adamw_launches(generate_transformer_trace(config, h200))


def test_generated_traces_round_trip_through_the_trace_format(tmp_path: Path, h200: GpuProfile) -> None:
    trace = generate_transformer_trace(small(precision="fp16"), h200, rng_seed=1)
    save_trace(trace, tmp_path / "tiny.trace.json")
    assert load_trace(tmp_path / "tiny.trace.json") == trace


def test_multi_tensor_apply_chunking() -> None:
    assert multi_tensor_launches([1] * 293, 1) == [110, 110, 73]
    assert multi_tensor_launches([65536 * 320 + 5], 4) == [65536 * 320, 5]
    assert sum(multi_tensor_launches([10**6, 3, 70000], 2)) == 10**6 + 3 + 70000


def test_seeded_noise_is_reproducible_and_small(h200: GpuProfile) -> None:
    config = small()
    exact = generate_transformer_trace(config, h200)
    assert generate_transformer_trace(config, h200) == exact
    first, again = generate_transformer_trace(config, h200, 7), generate_transformer_trace(config, h200, 7)
    other = generate_transformer_trace(config, h200, 8)
    assert first == again
    assert not np.array_equal(first.duration_s, other.duration_s)
    assert not np.array_equal(first.duration_s, exact.duration_s)
    log_ratio = np.log(first.duration_s / exact.duration_s)
    assert np.abs(log_ratio).max() < 6 * NOISE_SIGMA
    assert [k.name for k in first.kernels] == [k.name for k in exact.kernels]


@pytest.mark.parametrize(("changes", "field"), [
    ({"layers": 0}, "layers"), ({"d_model": -8}, "d_model"), ({"heads": 0}, "heads"), ({"ffn": 0}, "ffn"),
    ({"seq": 0}, "seq"), ({"batch": -1}, "batch"), ({"vocab": 0}, "vocab"), ({"layers": True}, "layers"),
    ({"heads": 3}, "heads"), ({"precision": "fp8"}, "precision"),
])
def test_bad_configs_fail_with_one_line_naming_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as error:
        small(**changes)
    assert field in str(error.value) and "\n" not in str(error.value)
    assert isinstance(error.value, KdvfsError)


def test_precision_missing_from_the_profile_is_an_error(h200: GpuProfile) -> None:
    roofline = dataclasses.replace(h200.roofline, peak_flops={"bf16": 1e15, "fp32": 6e13})
    profile = dataclasses.replace(h200, roofline=roofline)
    generate_transformer_trace(small(), profile)
    with pytest.raises(ConfigError, match=r"precision 'fp16'.*peak_flops"):
        generate_transformer_trace(small(precision="fp16"), profile)


def test_workload_files_are_strict(tmp_path: Path) -> None:
    good = "name: x\nlayers: 2\nd_model: 64\nheads: 2\nffn: 256\nseq: 16\nbatch: 1\nvocab: 100\n"
    (tmp_path / "x.yaml").write_text(good)
    assert load_workload(tmp_path / "x.yaml").precision == "bf16"
    (tmp_path / "extra.yaml").write_text(good + "dropout: 0.1\n")
    with pytest.raises(ConfigError, match="dropout"):
        load_workload(tmp_path / "extra.yaml")
    (tmp_path / "bad.yaml").write_text(good.replace("heads: 2", "heads: 3"))
    with pytest.raises(ConfigError, match="heads=3 does not divide d_model=64"):
        load_workload(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="unknown workload 'nope'"):
        load_workload("nope")


def test_layer_counting_on_the_real_trace() -> None:
    real = open_trace("h200/gpt3xl-24layer-b4")
    assert real.count(Kind.KERNEL) == 1438
    assert layer_kernel_counts(real, 24) == (55, 118)
    with pytest.raises(StepDetectionError):
        layer_kernel_counts(real, 1)


@pytest.mark.parametrize(("workload", "real_name"), [("gpt3xl", "h200/gpt3xl-24layer-b4"),
                                                     ("gpt2s", "h200/gpt2s-b16")])
def test_agrees_with_the_real_h200_trace(workload: str, real_name: str, h200: GpuProfile) -> None:
    config = load_workload(workload)
    generated, real = generate_transformer_trace(config, h200), open_trace(real_name)
    generated_per_layer, _ = layer_kernel_counts(generated, config.layers)
    real_per_layer, _ = layer_kernel_counts(real, config.layers)
    assert abs(generated_per_layer - real_per_layer) <= TOLERANCE * real_per_layer
    assert abs(generated.step_time_s - real.step_time_s) <= TOLERANCE * real.step_time_s


def test_mixture_of_experts_routes_syncs_and_runs_every_expert(h200: GpuProfile) -> None:
    dense, moe = (generate_transformer_trace(c, h200) for c in (small(), small(experts=4, top_k=2)))
    ops = [k.op.name for k in moe.kernels if k.op]
    assert {"aten::topk", "aten::index", "aten::index_add_", "aten::nonzero"} <= set(ops)
    syncs = [i for i, k in enumerate(moe.kernels) if k.kind is Kind.MEMCPY]
    assert len(syncs) == 2 * 4  # one routing sync per layer, forward and backward
    assert all(moe.kernels[i + 1].gap_before_s > 10 * moe.kernels[i].gap_before_s for i in syncs)
    assert ops.count("aten::addmm") > dense.count(Kind.KERNEL) // 100  # per-expert GEMMs
    assert sum(param_numels(small(experts=4, top_k=2))) > 3 * sum(param_numels(small())) // 2
    with pytest.raises(ConfigError, match="top_k"):
        small(experts=4, top_k=5)


def test_the_moe_preset_agrees_with_the_captured_moe_step(h200: GpuProfile) -> None:
    config = load_workload("mixtral-moe")
    generated = generate_transformer_trace(config, h200)
    real = load_trace(Path(__file__).parents[3] / "data" / "traces" / "h200" / "workloads" /
                      "mixtral-b8-s1024.trace.json.gz")
    assert abs(len(generated) - len(real)) <= TOLERANCE * len(real)
    gemms = [t.count(Kind.KERNEL) and sum(k.category is Category.GEMM for k in t.kernels) for t in (generated, real)]
    assert abs(gemms[0] - gemms[1]) <= TOLERANCE * gemms[1]
