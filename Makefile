# Two entry points (see README): `make demo` and `make test`. Both install what they need first.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
PYTEST_ARGS ?= -n 2
# Installed without their declared requirements (see requirements-yolov5.txt)
YOLOV5_NODEPS ?= yolov5==7.0.14 roboflow==1.7.3

.PHONY: install demo test bench clean

install:
	$(PIP) install -q -r requirements-ci.txt
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q -r requirements-yolov5.txt
	$(PIP) install -q --no-deps $(YOLOV5_NODEPS)

demo: install
	yolo-det train --profile repro project=runs/demo name=repro exist_ok=true

test: install
	YOLO_DET_REQUIRE_YOLOV5=1 $(PYTHON) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf runs build dist *.egg-info .pytest_cache .hypothesis
