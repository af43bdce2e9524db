# Two entry points (see README): `make demo` and `make test` (`make test-fast` skips the slow tests).
# Each installs what it needs first.
# PYTHON is the interpreter you start from. When it runs inside a virtualenv, that virtualenv is used;
# otherwise the project's own virtualenv $(VENV) is created from it on first use (a system Python that is
# "externally managed" (PEP 668) refuses plain pip installs).
PYTHON ?= python3
VENV ?= .venv
PY := $(shell $(PYTHON) -c 'import sys; print(sys.executable if sys.prefix != sys.base_prefix else "")' 2>/dev/null)
ifeq ($(strip $(PY)),)
PY := $(VENV)/bin/python
endif
PIP ?= $(PY) -m pip
PYTEST_ARGS ?= -n 2
# Installed without their declared requirements (see requirements-yolov5.txt)
YOLOV5_NODEPS ?= yolov5==7.0.14 roboflow==1.7.3

.PHONY: venv install install-test demo lint test test-fast test-other-machine test-compat bench clean

venv:
	@[ -x "$(PY)" ] || $(PYTHON) -m venv $(VENV)

install: venv
	$(PIP) install -q -r requirements-ci.txt
	$(PIP) install -q -e .

install-test: install
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q -r requirements-yolov5.txt
	$(PIP) install -q --no-deps $(YOLOV5_NODEPS)

demo: install
	$(PY) -m yolo_det train --profile repro project=$(CURDIR)/runs/demo name=repro exist_ok=true
	@# the audit exits 1 for this model on purpose (it names its non-deterministic layers); 2 would be an error
	$(PY) -m yolo_det audit data/models/attention-mix.yaml --imgsz 64; code=$$?; [ $$code -le 1 ]

# ruff check, ruff format --check (config: ruff.toml) and mypy (config: [tool.mypy] in pyproject.toml); `make test` runs them first
lint: install-test
	$(PY) -m ruff check yolo_det yolo_det_zoo tests bench
	$(PY) -m ruff format --check yolo_det yolo_det_zoo tests bench
	$(PY) -m mypy yolo_det yolo_det_zoo

test: lint
	YOLO_DET_REQUIRE_YOLOV5=1 $(PY) -m pytest $(PYTEST_ARGS) --durations=25

# The numerics-sensitive tests (export parity, deploy checks, batch invariance, layer equivalence, detections) on a simulated
# other machine: 3 cores and the AVX2 branch (tests/simulated_machine.py); .ci/run runs it after `make test`.
NUMERICS_TESTS ?= tests/test_export_parity.py tests/test_deploy_check.py tests/test_detections.py tests/test_batch_invariance.py \
	tests/test_layers_common.py tests/test_layers_modules.py tests/test_layers_pooling.py tests/test_layers_upsample.py \
	tests/test_layers_padding.py tests/test_layers_grid_sample.py tests/test_layers_loss.py
test-other-machine: install-test
	$(PY) tests/simulated_machine.py --cpus 3 --isa avx2 -- -m pytest $(PYTEST_ARGS) -p no:cacheprovider $(NUMERICS_TESTS)

# The older Ultralytics releases of the supported range, with the installed torch (bench/compat_matrix.py): each
# wheel is installed from PyPI into $(COMPAT_CACHE) (pip install --target, nothing in the venv changes), then the
# demo trains twice (digests equal; one epoch fewer differs), audit, and verify --resume-at 1. .ci/run runs it
# after test-other-machine. The older torch cells are run by hand when the range changes (docs/usage.md).
COMPAT_ULTRALYTICS ?= 8.3.0,8.3.253
COMPAT_CACHE ?= $(CURDIR)/runs/compat-cache
test-compat: install-test
	$(PY) bench/compat_matrix.py --ultralytics $(COMPAT_ULTRALYTICS) --cache $(COMPAT_CACHE) --out $(CURDIR)/runs/compat-ci.json

# The fast lane: every test but those marked slow (they train a model or take more than ~2 s).
test-fast: install-test
	$(PY) -m pytest $(PYTEST_ARGS) -m "not slow" --durations=15

bench: install-test
	$(PY) bench/bench_plugin.py
	$(PY) bench/bench_intercept.py
	$(PY) bench/bench_audit.py
	$(PY) bench/verify_cost.py
	$(PY) bench/bench_layers.py
	$(PY) bench/bench_datafp.py
	$(PY) bench/bench_portable.py
	$(PY) -m yolo_det bench --profiles repro,balanced,fast --plot bench/results/bench.png

clean:
	rm -rf runs build dist *.egg-info .pytest_cache .hypothesis
