"""The CLI tests' portal: one ASGI server (uvicorn on portal.asgi and the test database) for the
whole folder, and one Celery worker per module for the modules that run jobs. Each test makes
its own rows (transactional_db), which the server and the worker read from the same database."""

from collections.abc import Iterator

import pytest

from portal.core.tokens import token_create
from tests.cli_support import Cli
from tests.conftest import start_celery_worker, stop
from tests.stream_support import asgi_server

# Streams that look every 100-300 ms and keep alive every second; pages of 3 rows, so that the
# CLI's lists follow `next` links; tests.settings ends each stream after 10 s (reconnects).
SERVER_ENV = {
    "EVENTS_POLL_MS": "100",
    "EVENTS_HEARTBEAT_S": "1",
    "EVENTS_LOG_POLL_MS": "300",
    "API_PAGE_SIZE": "3",
}


@pytest.fixture(scope="package")
def portal(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[str]:
    """The portal's base URL, e.g. http://127.0.0.1:41234."""
    with asgi_server(tmp_path_factory.mktemp("asgi") / "asgi.log", **SERVER_ENV) as base:
        yield base


@pytest.fixture(scope="module")
def worker(django_db_setup, django_db_blocker, tmp_path_factory):
    """A real Celery worker for the module (the suite's `celery_worker` is one per test)."""
    from portal.celery import app

    with django_db_blocker.unblock():
        app.control.purge()
        proc = start_celery_worker(tmp_path_factory.mktemp("worker") / "worker.log")
    yield proc
    stop(proc)


@pytest.fixture
def token_of():
    """token_of(user): a new API token of the user (its key)."""
    return lambda user: token_create(user=user, name="cli-test")[1]


@pytest.fixture
def cli(tmp_path, portal) -> Cli:
    """`gpuportal` in a home of its own, the portal's URL in GPUPORTAL_URL and no token yet."""
    home = tmp_path / "home"
    home.mkdir()
    return Cli(home=home, url=portal)


@pytest.fixture
def member_cli(cli, member, token_of) -> Cli:
    """`gpuportal` as `member` of protein-lab, through GPUPORTAL_TOKEN."""
    cli.token = token_of(member)
    return cli
