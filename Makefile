# Two entry points (see README): `make demo` and `make test`. Both install what they need first.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
PYTEST_ARGS ?= -n 2

.PHONY: install demo test bench clean

install:
	$(PIP) install -q -r requirements-ci.txt
	$(PIP) install -q -e '.[test]'

demo: install
	yolo-det train --profile repro project=runs/demo name=repro exist_ok=true

test: install
	$(PYTHON) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf runs build dist *.egg-info .pytest_cache .hypothesis
