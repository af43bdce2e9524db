# Two entry points (see README): `make demo` and `make test`. Each installs what it needs first.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
PYTEST_ARGS ?= -n 2
# Installed without their declared requirements (see requirements-yolov5.txt)
YOLOV5_NODEPS ?= yolov5==7.0.14 roboflow==1.7.3

.PHONY: install install-test demo test bench clean

install:
	$(PIP) install -q -r requirements-ci.txt
	$(PIP) install -q -e .

install-test: install
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q -r requirements-yolov5.txt
	$(PIP) install -q --no-deps $(YOLOV5_NODEPS)

demo: install
	yolo-det train --profile repro project=$(CURDIR)/runs/demo name=repro exist_ok=true
	@# the audit exits 1 for this model on purpose (it names its non-deterministic layers); 2 would be an error
	yolo-det audit data/models/attention-mix.yaml --imgsz 64; code=$$?; [ $$code -le 1 ]

test: install-test
	YOLO_DET_REQUIRE_YOLOV5=1 $(PYTHON) -m pytest $(PYTEST_ARGS)

bench: install-test
	$(PYTHON) bench/bench_plugin.py
	$(PYTHON) bench/bench_intercept.py
	$(PYTHON) bench/bench_audit.py
	$(PYTHON) bench/verify_cost.py
	$(PYTHON) bench/bench_layers.py
	$(PYTHON) bench/bench_datafp.py
	yolo-det bench --profiles repro,balanced,fast --plot bench/results/bench.png

clean:
	rm -rf runs build dist *.egg-info .pytest_cache .hypothesis
