"""The connection to one cluster's API server, on the official `kubernetes` client.

Credentials come from ClusterConfig: either a kubeconfig (its current context; inline data only:
a kubeconfig that names files, an exec plugin or an auth provider would read or run things on
the portal's own machine, so it is refused) or an API URL with a bearer token and a CA. They are
never logged: errors carry the API server's message, never the request.

One ApiClient (one urllib3 pool) per cluster and process, rebuilt when the credentials change.
Every call has a (connect, read) timeout; the API server's answers are read as plain JSON.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import hashlib
import ipaddress
import json
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import urllib3
import yaml
from kubernetes.client.api_client import ApiClient
from kubernetes.client.configuration import Configuration
from kubernetes.client.exceptions import ApiException

from clusters.backends.base import BackendError, BackendUnavailable, ClusterConfig

_USER_KEYS = {"token", "client-certificate-data", "client-key-data"}
_REFUSED_USER_KEYS = {
    "exec": "an exec plugin",
    "auth-provider": "an auth provider",
    "tokenFile": "a token file",
    "client-certificate": "a certificate file",
    "client-key": "a key file",
    "username": "basic auth",
}


@dataclass(frozen=True)
class Connection:
    host: str
    token: str = ""
    ca_pem: str = ""
    client_cert_pem: str = ""
    client_key_pem: str = ""
    tls_server_name: str = ""

    def __repr__(self) -> str:  # never the secrets
        return f"Connection(host={self.host!r})"


def _pem(value: str, what: str) -> str:
    """PEM text as given, or decoded from the base64 of a kubeconfig's *-data field."""
    text = (value or "").strip()
    if not text or "-----BEGIN" in text:
        return text
    try:
        return base64.b64decode(text, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise BackendError(f"the cluster's {what} is neither PEM nor base64 of PEM") from None


def _check_host(host: str) -> str:
    """https, or plain http to this machine only (a token must not cross a network in clear)."""
    parts = urlsplit(host or "")
    if parts.scheme == "https" and parts.hostname:
        return host.rstrip("/")
    if parts.scheme == "http" and parts.hostname:
        name = parts.hostname
        try:
            loopback = ipaddress.ip_address(name).is_loopback
        except ValueError:
            loopback = name == "localhost"
        if loopback:
            return host.rstrip("/")
    raise BackendError(f"API server URL {host[:100]!r} must be https:// (http only to this machine)")


def connection(config: ClusterConfig) -> Connection:
    """Where and how to reach the cluster's API server; BackendError on a config that will not do."""
    if config.kubeconfig.strip():
        return _from_kubeconfig(config.kubeconfig)
    if not config.k8s_api_url:
        raise BackendError(f"cluster {config.slug}: set a kubeconfig, or an API URL with a token and CA")
    if not config.k8s_token.strip():
        raise BackendError(f"cluster {config.slug}: an API URL needs a bearer token")
    return Connection(
        host=_check_host(config.k8s_api_url.strip()),
        token=config.k8s_token.strip(),
        ca_pem=_pem(config.k8s_ca_cert, "CA certificate"),
    )


def _from_kubeconfig(text: str) -> Connection:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        raise BackendError("the kubeconfig is not valid YAML") from None
    if not isinstance(data, dict):
        raise BackendError("the kubeconfig is not a YAML mapping")

    def named(section: str, name: str) -> dict:
        for entry in data.get(section) or []:
            if isinstance(entry, dict) and entry.get("name") == name:
                return entry.get(section[:-1]) or {}
        raise BackendError(f"the kubeconfig has no {section[:-1]} {str(name)[:60]!r}")

    contexts = [c for c in data.get("contexts") or [] if isinstance(c, dict)]
    current = data.get("current-context") or (contexts[0].get("name") if len(contexts) == 1 else None)
    if not current:
        raise BackendError("the kubeconfig names no current-context")
    context = named("contexts", current)
    cluster, user = named("clusters", context.get("cluster")), named("users", context.get("user"))
    if cluster.get("certificate-authority"):
        raise BackendError("the kubeconfig names a CA file: give certificate-authority-data instead")
    if cluster.get("insecure-skip-tls-verify"):
        raise BackendError("the kubeconfig skips TLS verification: give certificate-authority-data instead")
    for key, what in _REFUSED_USER_KEYS.items():
        if user.get(key):
            raise BackendError(
                f"the kubeconfig's user uses {what}: give a token or inline client certificate"
            )
    if not _USER_KEYS & {key for key, value in user.items() if value}:
        raise BackendError("the kubeconfig's user has no token or client certificate")
    return Connection(
        host=_check_host(str(cluster.get("server") or "")),
        token=str(user.get("token") or ""),
        ca_pem=_pem(str(cluster.get("certificate-authority-data") or ""), "CA certificate"),
        client_cert_pem=_pem(str(user.get("client-certificate-data") or ""), "client certificate"),
        client_key_pem=_pem(str(user.get("client-key-data") or ""), "client key"),
        tls_server_name=str(cluster.get("tls-server-name") or ""),
    )


# ----------------------------------------------------------------- clients --
_lock = threading.Lock()
_clients: dict[str, tuple[str, ApiClient]] = {}
_key_dir: str | None = None


def _key_files(conn: Connection, digest: str) -> tuple[str, str]:
    """urllib3 loads a client certificate from files only: write them, private, once per process."""
    global _key_dir
    if _key_dir is None:
        _key_dir = tempfile.mkdtemp(prefix="portal-k8s-")  # mode 0700
        atexit.register(shutil.rmtree, _key_dir, True)
    paths = []
    for suffix, data in (("crt", conn.client_cert_pem), ("key", conn.client_key_pem)):
        path = os.path.join(_key_dir, f"{digest[:16]}.{suffix}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(data)
        paths.append(path)
    return paths[0], paths[1]


def api_client(config: ClusterConfig) -> ApiClient:
    """The pooled ApiClient of the cluster, for this process."""
    conn = connection(config)
    digest = hashlib.sha256(
        "\0".join([conn.host, conn.token, conn.ca_pem, conn.client_cert_pem, conn.client_key_pem]).encode()
    ).hexdigest()
    with _lock:
        cached = _clients.get(config.slug)
        if cached and cached[0] == digest:
            return cached[1]
        configuration = Configuration(host=conn.host)
        if conn.token:
            configuration.api_key = {"BearerToken": conn.token}
            configuration.api_key_prefix = {"BearerToken": "Bearer"}
        if conn.ca_pem:
            configuration.ca_cert_data = conn.ca_pem
        if conn.client_cert_pem:
            configuration.cert_file, configuration.key_file = _key_files(conn, digest)
        if conn.tls_server_name:
            configuration.tls_server_name = conn.tls_server_name
        # one retry of a failed connect; none of a read, so a call lasts at most its timeouts twice
        configuration.retries = urllib3.util.Retry(total=1, connect=1, read=0, status=0, redirect=0, other=0)
        if conn.host.startswith("http://"):  # this machine (see _check_host): never through a proxy
            configuration.proxy = None
        client = ApiClient(configuration)
        client.user_agent = "gpu-portal"
        if cached:
            cached[1].close()
        _clients[config.slug] = (digest, client)
        return client


# ------------------------------------------------------------------ errors --
def status_message(exc: ApiException) -> str:
    """The message of the API server's Status body, or the HTTP reason."""
    try:
        body = json.loads(exc.body or "")
        message = body.get("message") if isinstance(body, dict) else None
    except ValueError:
        message = None
    return " ".join(str(message or exc.reason or "").split())[:400]


def translate(exc: BaseException, what: str) -> BackendError:
    """A client error as BackendUnavailable (wait and retry) or BackendError (will not work as is)."""
    if isinstance(exc, ApiException):
        code, message = exc.status or 0, status_message(exc)
        if code == 0:  # TLS handshake and the like
            return BackendUnavailable(f"{what}: no TLS connection to the API server: {message[:200]}")
        if code == 401:
            return BackendUnavailable(
                f"{what}: the API server refused the portal's credentials (401): renew the cluster's token"
            )
        if code == 403 and "exceeded quota" in message:
            return BackendUnavailable(f"{what}: {message}")
        if code == 403 and "being terminated" in message:
            return BackendError(f"{what}: {message}")
        if code == 403:
            return BackendError(
                f"{what}: forbidden by RBAC: {message}. Grant the portal's service account the "
                "ClusterRole rules of the README (Kubernetes clusters)"
            )
        if code in (408, 429) or code >= 500:
            return BackendUnavailable(f"{what}: the API server answered {code}: {message}")
        return BackendError(f"{what}: the API server answered {code}: {message}")
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        detail = " ".join(str(exc).split())[:240]
        return BackendUnavailable(f"{what}: cannot reach the API server ({type(exc).__name__}: {detail})")
    return BackendError(f"{what}: {type(exc).__name__}")


class Api:
    """REST calls through the client's ApiClient (auth, TLS, pool), with timeouts. Bodies are
    plain dicts both ways: the generated typed methods would refuse fields newer than the client."""

    def __init__(self, client: ApiClient, timeout: tuple[float, float]):
        self.client = client
        self.timeout = timeout

    def request(
        self,
        what: str,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: dict | None = None,
        allow: tuple[int, ...] = (),
        stream: bool = False,
    ) -> tuple[int, Any]:
        """(HTTP status, JSON body) of one call; a status in `allow` is returned, any other
        failure raised as BackendError/BackendUnavailable. With stream, the unread urllib3
        response instead of the body, for the caller to read as much as it wants and release."""
        headers = {"Accept": "*/*" if stream else "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        request = self.client.param_serialize(
            method,
            path,
            query_params=[(key, value) for key, value in (query or {}).items() if value is not None],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.client.call_api(*request, _request_timeout=self.timeout)
            if not 200 <= response.status <= 299:
                response.read()
                if response.status in allow:
                    try:
                        return response.status, json.loads(response.data or b"{}")
                    except ValueError:
                        return response.status, {}
                raise ApiException(http_resp=response)
            if stream:
                return response.status, response.response
            try:
                return response.status, json.loads(response.read() or b"{}")
            except ValueError:
                raise BackendUnavailable(f"{what}: the API server's answer is not JSON") from None
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise translate(exc, what) from None
