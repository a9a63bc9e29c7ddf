# kdvfs developer entry points. `make demo` and `make test` are the README's Quick start.
PYTHON ?= python3
VENV ?= .venv
# Where torch comes from: pip's own indexes by default (torch pinned in constraints.txt; on a GPU machine install
# your CUDA build of torch into $(VENV) first). A CPU-only machine or CI takes PyTorch's CPU-only build with
# `make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu` (no CUDA packages).
TORCH_INDEX ?=
BIN := $(VENV)/bin
RAW := data/raw/h200
OUT := data/traces/h200

.PHONY: setup demo test lint bundled-traces calibrate clean

$(BIN)/kdvfs: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX) )-c constraints.txt torch
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,examples]'
	touch $@

setup: $(BIN)/kdvfs

demo: setup
	$(BIN)/kdvfs demo
	@echo "kdvfs is installed in $(VENV): run \`source $(VENV)/bin/activate\` to put it on your PATH"

# The fast suite on every core (pytest-xdist), a test file per worker at a time (a file's module fixtures, such
# as a torchrun capture or a built wheel, are then made once), with mypy beside it on the cores the tests leave
# idle while they wait on their subprocesses; mypy's report follows the tests'. Fails if either fails.
test: setup
	$(BIN)/ruff check kdvfs common envs agents runtime tests benchmarks scripts examples
	@types_log=$$(mktemp); $(BIN)/mypy > $$types_log 2>&1 & types=$$!; \
	$(BIN)/python -m pytest -q -n auto --dist loadfile; tests_code=$$?; \
	wait $$types; types_code=$$?; cat $$types_log; rm -f $$types_log; \
	test $$tests_code -eq 0 -a $$types_code -eq 0

lint: setup
	$(BIN)/ruff check kdvfs common envs agents runtime tests benchmarks scripts examples
	$(BIN)/mypy

# Re-create the bundled kdvfs traces from the raw H200 recordings (see data/README.md).
bundled-traces: setup
	$(BIN)/kdvfs trace import $(RAW)/trace_gpt3xl_24layer_b4.json.gz -o $(OUT)/gpt3xl-24layer-b4.trace.json \
		--workload gpt3xl-24layer-b4 --ref-mem-mhz 3201 --observed-core-mhz 1665 \
		--energy-j-per-step 109.87776923076923 --step-time-s 0.15864369205128198
	$(BIN)/kdvfs trace import $(RAW)/trace_gpt3xl_1layer_b4.json.gz -o $(OUT)/gpt3xl-1layer-b4.trace.json \
		--workload gpt3xl-1layer-b4 --ref-mem-mhz 3201 --observed-core-mhz 1980 --ncu $(RAW)/ncu_gpt3xl_1layer.csv.gz \
		--energy-j-per-step 25.567474999999998 --step-time-s 0.05164994993750001
	$(BIN)/kdvfs trace import $(RAW)/trace_gpt2s_b16.json.gz -o $(OUT)/gpt2s-b16.trace.json \
		--workload gpt2s-b16 --ref-mem-mhz 3201 --observed-core-mhz 1935 \
		--energy-j-per-step 32.9578359375 --step-time-s 0.04751704915624999
	$(BIN)/kdvfs trace import $(RAW)/trace_resnet50_b128.json.gz -o $(OUT)/resnet50-b128.trace.json \
		--workload resnet50-b128 --ref-mem-mhz 3201 --observed-core-mhz 1980 --ncu $(RAW)/ncu_resnet50_first400.csv.gz \
		--energy-j-per-step 17.24685789473684 --step-time-s 0.031753824189473714

# Re-create the sweeps and the shipped profiles' cost-model parameters (see docs/design/cost-model.md).
calibrate: setup
	$(BIN)/kdvfs model convert wang-chu data/raw/public/gtx980-dvfs-sweep.csv --gpu gtx980 -o data/sweeps/gtx980.sweep.csv
	$(BIN)/kdvfs model convert wang-chu data/raw/public/gtx1080ti-dvfs-sweep.csv --gpu gtx1080ti \
		-o data/sweeps/gtx1080ti.sweep.csv
	$(BIN)/kdvfs model convert h200-default data/raw/h200 -o data/sweeps/h200-default.sweep.csv
	$(BIN)/kdvfs model fit --sweep data/sweeps/h200-default.sweep.csv --gpu h200 \
		--fix voltage_min,voltage_knee_fraction,leakage_w,traffic_core_share --write
	$(BIN)/python scripts/derive_profile_estimates.py
	$(BIN)/python scripts/fit_rtx3080ti_table1.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
