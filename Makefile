# The two commands of the README: `make run` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed-stamp
MO := locale/zh_Hans/LC_MESSAGES/django.mo

.PHONY: run test lint format messages testbed-up testbed-down testbed-status schema clean

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e ".[dev]"
	touch $@

# The compiled translations are built, not committed.
$(MO): locale/zh_Hans/LC_MESSAGES/django.po $(STAMP)
	$(VENV)/bin/python manage.py compilemessages --ignore=$(VENV) --ignore=var -v0

run: $(STAMP) $(MO)
	scripts/run

test: $(STAMP) $(MO)
	bash tests/testbed/testbed.sh up
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

messages: $(STAMP)
	$(VENV)/bin/python manage.py makemessages -l zh_Hans --ignore=var --ignore=artifacts --ignore=tests \
		--ignore=bench --ignore=scripts --ignore=$(VENV) --ignore='*.egg-info'

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
