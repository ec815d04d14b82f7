"""A small, real Kubernetes API server for tests (no cluster installs here); see server.FakeApiServer."""

from .server import FakeApiServer
from .store import ApiError

__all__ = ["ApiError", "FakeApiServer"]
