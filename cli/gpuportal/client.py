"""A small typed client of the portal's REST API (docs/api.md), on httpx.

One `Client`, one method per endpoint. Answers are the API's JSON objects, typed in answers.py;
every refusal is one `ApiError` (errors.py) built from the problem+json body, and a network
failure is one too (status 0); the streams are read by sse.py. Requests go to the
configured portal only: no redirects are followed, no proxy or netrc from the environment is
used, and a pagination link to another origin is refused. Every request has a timeout.
"""

from __future__ import annotations

import re
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from gpuportal import __version__
from gpuportal.answers import (
    Advice,
    GroupBy,
    Job,
    JobEvent,
    Log,
    Me,
    Quota,
    Scenario,
    Template,
    Tenant,
    TokenCreated,
    Usage,
)
from gpuportal.errors import ApiError, network_error
from gpuportal.i18n import CHINESE, LANGUAGE, _
from gpuportal.sse import StreamEvent, parse_sse

DEFAULT_TIMEOUT_S = 30.0
STREAM_READ_TIMEOUT_S = 60.0  # the streams send a comment after 15 s of silence
DEFAULT_PAGE_SIZE = 50  # the API's, unless the site changed API_PAGE_SIZE
MAX_PAGES = 500  # a list is followed through at most this many `next` links
RETRIES = 2  # a 429 or an overload 503 that names a short Retry-After is retried this often
RETRY_AFTER_MAX_S = 10

TOKEN_FORM = re.compile(r"^[\x21-\x7e]{1,512}\Z")  # printable ASCII, no space: what a header may carry


# --- The client ------------------------------------------------------------------------------------


def normalize_url(url: str) -> str:
    """The portal's base URL, without a trailing slash; ValueError if it is not http(s)://host."""
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(
            _("Not a portal URL: {url} (expected http(s)://host[:port][/path]).").format(url=url)
        )
    if parts.path.endswith("/api/v1"):
        url = url.removesuffix("/api/v1")
    return url


@dataclass
class Client:
    """The portal at `url` (e.g. https://gpu.example.org), as the holder of `token`."""

    url: str
    token: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    ca_bundle: str | None = None
    _http: httpx.Client = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.url = normalize_url(self.url)
        if self.token is not None and not TOKEN_FORM.match(self.token):
            # never quoted back: it may be a real token with a stray character
            raise ValueError(
                _("The token has spaces or characters no token has; check GPUPORTAL_TOKEN or log in again.")
            )
        self.api = self.url + "/api/v1"
        headers = {
            "User-Agent": f"gpuportal/{__version__}",
            "Accept": "application/json",
            # the portal's own messages (a problem's detail, field errors) in the CLI's language
            "Accept-Language": "zh-Hans" if LANGUAGE == CHINESE else "en",
        }
        if self.token:
            headers["Authorization"] = f"Token {self.token}"
        verify: ssl.SSLContext | bool = True
        if self.ca_bundle:
            try:
                verify = ssl.create_default_context(cafile=self.ca_bundle)
            except OSError as exc:  # ssl.SSLError too: not a PEM bundle
                raise ValueError(
                    _("Cannot use the CA bundle {path}: {error}.").format(
                        path=self.ca_bundle, error=exc.strerror or type(exc).__name__
                    )
                ) from None
        self._http = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0)),
            follow_redirects=False,
            trust_env=False,  # no proxy, netrc or other CA from the environment: this URL only
            verify=verify,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing

    def _check_origin(self, url: str) -> str:
        """A URL the API gave (a `next` link): only on the configured portal."""
        mine, theirs = urlsplit(self.api), urlsplit(url)
        if (theirs.scheme, theirs.netloc) != (mine.scheme, mine.netloc) or not theirs.path.startswith(
            mine.path
        ):
            raise ApiError(
                0,
                "foreign_link",
                _("The portal linked to {url}, outside {base}: not followed.").format(url=url, base=self.url),
            )
        return url

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        body: Any = None,
        headers: dict[str, str] | None = None,
        retry: bool = True,
    ) -> httpx.Response:
        url = path if path.startswith("http") else self.api + path
        for attempt in range(RETRIES + 1):
            try:
                response = self._http.request(method, url, params=params, json=body, headers=headers)
            except httpx.HTTPError as exc:
                raise network_error(self.url, exc, self.token) from None
            if 300 <= response.status_code < 400:
                raise ApiError(
                    response.status_code,
                    "redirect",
                    _(
                        "The portal answered with a redirect to {location}: log in with that URL instead."
                    ).format(location=response.headers.get("Location", "?")),
                )
            if response.status_code < 400:
                return response
            error = ApiError.of(response)
            wait = error.problem.get("retry_after_s")
            if (
                retry
                and attempt < RETRIES
                and response.status_code in (429, 503)
                and isinstance(wait, int)
                and 0 <= wait <= RETRY_AFTER_MAX_S
            ):
                time.sleep(wait)
                continue
            raise error
        raise AssertionError("unreachable")  # pragma: no cover

    def _json(self, response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError:
            raise ApiError(
                response.status_code,
                "not_json",
                _("The answer from {url} is not JSON: is it the portal's URL?").format(url=self.url),
            ) from None

    def _get(self, path: str, **params: Any) -> Any:
        return self._json(
            self._request("GET", path, params={k: v for k, v in params.items() if v is not None})
        )

    def _pages(self, path: str, params: dict[str, Any], limit: int | None = None) -> list[Any]:
        """Every item of a cursor-paginated list, following `next` (up to `limit` items)."""
        params = {k: v for k, v in params.items() if v not in (None, [], "")}
        if limit is not None and limit > DEFAULT_PAGE_SIZE:
            params["page_size"] = min(limit, 200)  # fewer, larger pages (the most the API allows)
        items: list[Any] = []
        url: str | None = path
        for _page in range(MAX_PAGES):
            page = self._json(self._request("GET", url, params=params if url == path else None))
            items.extend(page["results"])
            if limit is not None and len(items) >= limit:
                return items[:limit]
            if not page.get("next"):
                return items
            url = self._check_origin(page["next"])
        return items

    # -- auth and me

    def token_create(
        self,
        username: str,
        password: str,
        *,
        name: str = "",
        scope: str | None = None,
        expires_in_days: int | None = None,
    ) -> TokenCreated:
        body: dict[str, Any] = {"username": username, "password": password, "name": name}
        if scope:
            body["scope"] = scope
        if expires_in_days:
            body["expires_in_days"] = expires_in_days
        return self._json(self._request("POST", "/auth/token/", body=body, retry=False))

    def token_delete(self, token_id: str) -> None:
        self._request("DELETE", f"/auth/tokens/{token_id}/", retry=False)

    def me(self) -> Me:
        return self._get("/me/")

    # -- tenants, catalog, quota

    def tenants(self) -> list[Tenant]:
        return self._pages("/tenants/", {})

    def quotas(self, *, tenant: str | None = None, active: bool | None = None) -> list[Quota]:
        return self._pages(
            "/quotas/", {"tenant": tenant, "active": None if active is None else str(active).lower()}
        )

    def scenarios(self) -> list[Scenario]:
        return self._pages("/scenarios/", {})

    def scenario(self, slug: str) -> Scenario:
        return self._get(f"/scenarios/{slug}/")

    def advise(self, scenario: str, inputs: dict[str, Any]) -> Advice:
        return self._json(self._request("POST", f"/scenarios/{scenario}/advise/", body=inputs))

    # -- jobs

    def templates(self, *, scenario: str | None = None) -> list[Template]:
        return self._get("/templates/", scenario=scenario or None)["results"]

    def jobs(
        self,
        *,
        tenant: str | None = None,
        states: list[str] | None = None,
        scenario: str | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        return self._pages("/jobs/", {"tenant": tenant, "state": states or [], "scenario": scenario}, limit)

    def job(self, job_id: str) -> Job:
        return self._get(f"/jobs/{job_id}/")

    def submit(self, body: dict[str, Any], *, idempotency_key: str | None = None) -> tuple[Job, bool]:
        """The job, and whether this request made it (201) or a repeat of its key found it (200)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        # Retried only with a key: a retry without one could submit the job twice.
        response = self._request("POST", "/jobs/", body=body, headers=headers, retry=bool(idempotency_key))
        return self._json(response), response.status_code == 201

    def cancel(self, job_id: str) -> Job:
        return self._json(self._request("POST", f"/jobs/{job_id}/cancel/", retry=False))

    def job_events(self, job_id: str) -> list[JobEvent]:
        return self._get(f"/jobs/{job_id}/events/")

    def job_log(self, job_id: str, *, tail: int = 100) -> Log:
        return self._get(f"/jobs/{job_id}/log/", tail=tail)

    def usage(
        self,
        *,
        tenant: str | None = None,
        start: str | None = None,
        end: str | None = None,
        group_by: GroupBy | None = None,
    ) -> Usage:
        return self._get("/usage/", tenant=tenant, group_by=group_by, **{"from": start, "to": end})

    # -- live events (Server-Sent Events)

    @contextmanager
    def event_stream(
        self,
        *,
        tenant: str | None = None,
        last_event_id: str | None = None,
        read_timeout_s: float = STREAM_READ_TIMEOUT_S,
    ) -> Iterator[Iterator[StreamEvent]]:
        """GET /events/stream/: the job events of the caller's tenants (of `tenant`), after
        `last_event_id` when given. Yields an iterator that ends when the server ends the stream."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        params = {"tenant": tenant} if tenant else None
        with self._stream("/events/stream/", params, headers, read_timeout_s) as events:
            yield events

    @contextmanager
    def log_stream(
        self, job_id: str, *, read_timeout_s: float = STREAM_READ_TIMEOUT_S
    ) -> Iterator[Iterator[StreamEvent]]:
        """GET /jobs/{id}/log/stream/: `log`, `state`, `unavailable` and last `end` events."""
        with self._stream(
            f"/jobs/{job_id}/log/stream/", None, {"Accept": "text/event-stream"}, read_timeout_s
        ) as events:
            yield events

    @contextmanager
    def _stream(
        self, path: str, params: dict[str, str] | None, headers: dict[str, str], read_timeout_s: float
    ) -> Iterator[Iterator[StreamEvent]]:
        timeout = httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0), read=read_timeout_s)
        request = self._http.build_request(
            "GET", self.api + path, params=params, headers=headers, timeout=timeout
        )
        try:
            response = self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise network_error(self.url, exc, self.token) from None
        try:
            if response.status_code >= 400:
                response.read()
                raise ApiError.of(response)
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                raise ApiError(
                    response.status_code,
                    "not_event_stream",
                    _("The answer from {url} is not an event stream: is it the portal's URL?").format(
                        url=self.url
                    ),
                )
            yield self._events(response)
        finally:
            response.close()

    def _events(self, response: httpx.Response) -> Iterator[StreamEvent]:
        try:
            yield from parse_sse(response.iter_lines())
        except httpx.HTTPError as exc:
            raise network_error(self.url, exc, self.token) from None
