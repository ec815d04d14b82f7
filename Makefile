# The two commands of the README: `make run` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed-stamp

.PHONY: run test lint format testbed-up testbed-down testbed-status schema clean

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e ".[dev]"
	touch $@

run: $(STAMP)
	scripts/run

test: $(STAMP)
	bash tests/testbed/testbed.sh up
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

schema: $(STAMP)
	$(VENV)/bin/python manage.py spectacular --validate --fail-on-warn --file var/openapi.yaml

testbed-up:
	bash tests/testbed/testbed.sh up

testbed-down:
	bash tests/testbed/testbed.sh down

testbed-status:
	bash tests/testbed/testbed.sh status

clean:
	rm -rf $(VENV) var/static var/celery
