"""The one error of the API client: a refusal (problem+json) or no answer at all."""

from __future__ import annotations

from typing import Any

import httpx

from gpuportal.i18n import _


class ApiError(Exception):
    """A refusal of the API (problem+json), or no answer at all (status 0)."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        errors: dict[str, list[str]] | None = None,
        problem: dict[str, Any] | None = None,
    ):
        self.status = status
        self.code = code
        self.detail = detail
        self.errors = errors or {}
        self.problem = problem or {}
        super().__init__(f"{status} {code}: {detail}")

    @classmethod
    def of(cls, response: httpx.Response) -> ApiError:
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("code"), str):
            errors = body.get("errors") if isinstance(body.get("errors"), dict) else {}
            return cls(response.status_code, body["code"], str(body.get("detail", "")), errors, body)
        # Not the portal's problem+json: a proxy's page, say. Only the status is worth saying.
        return cls(
            response.status_code,
            f"http_{response.status_code}",
            _("The server answered HTTP {status} {reason}, not the portal's JSON.").format(
                status=response.status_code, reason=response.reason_phrase
            ),
        )


def network_error(url: str, exc: httpx.HTTPError, secret: str | None) -> ApiError:
    """No answer: a timeout, or the connection failed. The error's own text names the cause (a
    refused connection, a name that does not resolve) but may quote a header: the token is
    cut out of it, and a protocol error is only named."""
    if isinstance(exc, httpx.TimeoutException):
        return ApiError(
            0,
            "timeout",
            _("No answer from {url} in time ({error}).").format(url=url, error=type(exc).__name__),
        )
    error = type(exc).__name__ if isinstance(exc, httpx.ProtocolError) else str(exc) or type(exc).__name__
    if secret:
        error = error.replace(secret, "***")
    return ApiError(0, "unreachable", _("Cannot reach {url}: {error}.").format(url=url, error=error))
