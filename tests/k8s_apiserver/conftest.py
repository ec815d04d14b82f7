"""The fake API server's tests' fixtures: a server with its nodes (its controller must have met no
error), the official client on it, and a namespace."""

import pytest

from tests.k8s_apiserver_support import api_server, k8s_client, team_namespace


@pytest.fixture
def api():
    yield from api_server()


@pytest.fixture
def k8s(api):
    yield from k8s_client(api)


@pytest.fixture
def ns(k8s):
    return team_namespace(k8s)
