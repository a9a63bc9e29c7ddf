#!/bin/bash
# One-rank torchrun on the H200, read-only: capture, plan, dry run (NVML through the refusing guard).
# Run on the device machine from the repo root with the wheels of gymnasium, farama-notifications,
# stable-baselines3 and highspy in .whl/ (carried); results under $OUT/tr, summarised in
# benchmarks/results/torchrun_one_rank_h200.md.
set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$OUT/tr; mkdir -p $D
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader
timeout 200 python3 -m benchmarks.common.kd capture --nvml-module benchmarks.common.nvml_guard --steps 3 --json -o $D/step.trace.json -- torchrun --nproc-per-node 1 examples/gpt.py --size gpt2s --batch 16 --ddp --steps 600 > $D/capture.json; echo capture rc=$?
ls $D
timeout 60 python3 -m benchmarks.common.kd plan --trace $D/step.trace.json --gpu h200 --method latency-optimal --budget 0.01 -o $D/plan.json; echo plan rc=$?
KDVFS_NVML_RECORD=$D/nvml_calls.json timeout 250 python3 -m benchmarks.common.kd run --dry-run --json --nvml-module benchmarks.common.nvml_guard --policy $D/plan.json --trace $D/step.trace.json --log $D/run.jsonl -- torchrun --nproc-per-node 1 examples/gpt.py --size gpt2s --batch 16 --ddp --steps 2500 > $D/run.json; echo run rc=$?
python3 -c "import json; d=json.load(open('$D/run.json')); print({k: d.get(k) for k in ['steps','controlled_steps','mismatches','backed_off','measured','gpu_restored']}); print(d.get('ranks'))"
gzip -f $D/run.rank0.jsonl 2>/dev/null; ls -la $D
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader
