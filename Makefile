# The two commands of the README: `make run` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed-stamp
MO := locale/zh_Hans/LC_MESSAGES/django.mo
LDAP := $(VENV)/.ldap-stamp
NEWMAN := postman/node_modules/.installed
OIDC := tests/oidc_provider/node_modules/.installed

.PHONY: run test contract bench lint format messages testbed-up testbed-down testbed-status schema clean

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e ".[dev,cli]"
	touch $@

# django-auth-ldap and python-ldap, which compiles against Debian's libldap2-dev and libsasl2-dev
# (.ci/run installs them): the suite signs in against a real slapd.
$(LDAP): pyproject.toml $(STAMP)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e ".[dev,ldap]"
	touch $@

# The compiled translations are built, not committed.
$(MO): locale/zh_Hans/LC_MESSAGES/django.po $(STAMP)
	$(VENV)/bin/python manage.py compilemessages --ignore=$(VENV) --ignore=var -v0

# oidc-provider, pinned by tests/oidc_provider/package-lock.json: the suite's OpenID provider.
$(OIDC): tests/oidc_provider/package-lock.json
	npm ci --prefix tests/oidc_provider --no-audit --no-fund --loglevel=error
	touch $@

# newman, pinned by postman/package-lock.json, for the Postman contract tests.
$(NEWMAN): postman/package-lock.json
	npm ci --prefix postman --no-audit --no-fund --loglevel=error
	touch $@

run: $(STAMP) $(MO)
	scripts/run

# The suite, then the API contract (Postman through newman, then schemathesis) against the
# production-shaped stack: gunicorn, Celery worker and beat on Redis, PostgreSQL, Slurm testbed.
test: $(STAMP) $(LDAP) $(MO) $(NEWMAN) $(OIDC)
	bash tests/testbed/testbed.sh up
	$(VENV)/bin/pytest $(PYTEST_ARGS)
	scripts/contract

contract: $(STAMP) $(MO) $(NEWMAN)
	scripts/contract

# Every figure of docs/performance.md, printed (about 25 minutes; BENCH_ONLY picks steps).
bench: $(STAMP) $(MO)
	scripts/bench

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

messages: $(STAMP)
	$(VENV)/bin/python manage.py makemessages -l zh_Hans --ignore=var --ignore=artifacts --ignore=tests \
		--ignore=bench --ignore=scripts --ignore=cli --ignore=$(VENV) --ignore='*.egg-info'

schema: $(STAMP)
	$(VENV)/bin/python manage.py spectacular --validate --fail-on-warn --file var/openapi.yaml

testbed-up:
	bash tests/testbed/testbed.sh up

testbed-down:
	bash tests/testbed/testbed.sh down

testbed-status:
	bash tests/testbed/testbed.sh status

clean:
	rm -rf $(VENV) var/static var/celery postman/node_modules tests/oidc_provider/node_modules
