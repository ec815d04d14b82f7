"""The HTTP side: routing, bearer-token auth, JSON in and out, v1 Status errors."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import uuid
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from .controller import Cluster
from .store import BY_NAME, BY_PATH, ApiError, Res, Store, details

VERSION = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0",
    "gitCommit": "9e05bc5a3d8b8a2fb8d2e3c2b4ddd4e58d1d6e8a",
    "gitTreeState": "clean",
    "buildDate": "2024-08-13T07:28:49Z",
    "goVersion": "go1.22.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}
JOB_DELETE_WARNING = (
    '299 - "child pods are preserved by default when jobs are deleted; set propagationPolicy=Background to '
    'remove them or set propagationPolicy=Orphan to suppress this warning"'
)
NO_ROUTE = ApiError(404, "NotFound", "the server could not find the requested resource")
_TIME_KEYS = ("startTime", "completionTime", "lastTransitionTime", "lastProbeTime")


def _shifted(timestamp: str, seconds: float) -> str:
    when = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return (when - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeApiServer:
    """A small, real Kubernetes API server on 127.0.0.1 for tests, with a job controller and a test kubelet.

    with FakeApiServer(token="t0k", nodes=[{"name": "gpu-1", "labels": {...}, "capacity": {"nvidia.com/gpu": "8"},
                                            "taints": [...]}]) as api:
        api.url              # http://127.0.0.1:PORT
        api.objects("Job")   # deep copies of what is stored
        api.requests         # [(method, path, {query}), ...] of every request served
        api.backdate("Job", "ns", "pj-x", 7200)  # as if the Job had ended two hours ago
    Deleting a Job deletes its pods as Kubernetes' garbage collector does, each with its own
    terminationGracePeriodSeconds (a Job's DeleteOptions, gracePeriodSeconds included, are not passed on):
    SIGTERM, then SIGKILL once the grace is out (at most controller.MAX_GRACE_S here). A pod whose
    PersistentVolumeClaim does not exist is not scheduled; claims are bound at once.
    Not modelled: watch, JSON Patch (415), container restarts (restartPolicy is treated as Never), the Job
    controller's pod-failure backoff delay, Kueue admission (LocalQueues, ClusterQueues and ResourceFlavors
    are stored, a LocalQueue's clusterQueue immutable as Kueue's CRD has it), LimitRange/PriorityClass
    admission (stored only), volumes (the test kubelet has no mount namespace: an env value under the
    mountPath of a PersistentVolumeClaim names the claim's directory on this machine instead, one per claim
    for the server's life; other paths are this machine's),
    schedulerName (one scheduler places every pod, HAMi's slices included: give a node the capacity of
    the extended resources its pods ask for, nvidia.com/gpumem too).
    """

    def __init__(self, token: str = "t0k", nodes: list[dict] | None = None, tick_s: float = 0.05):  # noqa: S107
        self.token = token
        self.store = Store(nodes)
        self.cluster = Cluster(self.store, tick_s)
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def objects(self, kind: str) -> list[dict]:
        """Every stored object of a kind ("Job" or "jobs"), as deep copies."""
        return self.store.objects(kind)

    def backdate(self, kind: str, namespace: str, name: str, seconds: float) -> None:
        """Move an object's status times (a Job's startTime, completionTime, conditions) `seconds`
        into the past, the TTL controller's clock with them: as if it had ended that long ago."""
        with self.store.lock:
            obj = self.store.get(BY_NAME[kind], namespace, name)
            status = obj.get("status") or {}
            for holder in [status, *(status.get("conditions") or [])]:
                for key, value in holder.items():
                    if key in _TIME_KEYS and isinstance(value, str):
                        holder[key] = _shifted(value, seconds)
            obj["metadata"]["resourceVersion"] = self.store.next_rv()
            clock = self.cluster.clock.get(obj["metadata"]["uid"], {})
            for key in clock:
                clock[key] -= seconds

    def start(self) -> FakeApiServer:
        self._httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.api = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="fake-k8s-http")
        self._thread.start()
        self.cluster.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            with self._httpd.conn_lock:  # idle keep-alive connections would hold their threads otherwise
                for conn in self._httpd.connections:
                    with contextlib.suppress(OSError):
                        conn.shutdown(socket.SHUT_RDWR)
            self._httpd.server_close()  # joins the request threads
            self._thread.join(timeout=10)
            self._httpd = None
        self.cluster.stop()

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = False  # so that server_close() joins them
    api: FakeApiServer

    def __init__(self, *args):
        self.connections: set[socket.socket] = set()
        self.conn_lock = threading.Lock()
        super().__init__(*args)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # the longest an idle keep-alive connection keeps its thread

    def setup(self) -> None:
        super().setup()
        with self.server.conn_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.conn_lock:
            self.server.connections.discard(self.connection)
        super().finish()

    def log_message(self, format, *args) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _handle(self) -> None:
        api, url = self.server.api, urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        api.requests.append((self.command, url.path, query))
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers, ctype = {}, "application/json"
        try:
            scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
            if scheme.lower() != "bearer" or token.strip() != api.token:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            with api.store.lock:  # serialised under the lock: the controllers change objects in place
                code, body = self._route(url.path.rstrip("/"), query, raw, headers)
                if isinstance(body, bytes):
                    payload, ctype = body, "text/plain; charset=utf-8"
                else:
                    payload = json.dumps(body).encode()
        except ApiError as exc:
            code, payload = exc.code, json.dumps(exc.status()).encode()
        except Exception as exc:  # a bug here, or a malformed parameter: answer as the API server would
            code, payload = 500, json.dumps(ApiError(500, "InternalError", repr(exc)).status()).encode()
        self.send_response(code)
        headers |= {"Content-Type": ctype, "Content-Length": str(len(payload)), "Audit-Id": str(uuid.uuid4())}
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(payload)

    def _route(self, path: str, query: dict, raw: bytes, headers: dict) -> tuple[int, object]:
        """/api/v1/..., /apis/<group>/<version>/...: [namespaces/<ns>/]<plural>[/<name>[/log|/status]]."""
        if self.command == "GET" and path in ("/readyz", "/livez", "/healthz"):
            return 200, b"ok"
        if self.command == "GET" and path == "/version":
            return 200, VERSION
        parts = [unquote(p) for p in path.split("/")[1:]]
        if parts[:2] == ["api", "v1"]:
            gv, rest = "v1", parts[2:]
        elif parts[0] == "apis" and len(parts) > 3:
            gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            raise NO_ROUTE
        if len(rest) >= 3 and rest[0] == "namespaces" and (gv, rest[2]) in BY_PATH:
            ns, res, tail = rest[1], BY_PATH[(gv, rest[2])], rest[3:]
        elif (gv, rest[0]) in BY_PATH:
            res, tail = BY_PATH[(gv, rest[0])], rest[1:]
            ns = "" if not res.namespaced else None  # None: all namespaces, lists only
        else:
            raise NO_ROUTE
        name, sub = [*tail, None, None][:2]
        subresources = (None, "status", "log") if res.plural == "pods" else (None, "status")
        if len(tail) > 2 or (ns is None and name) or sub not in subresources:
            raise NO_ROUTE
        return self._serve(res, ns, name, sub, query, raw, headers)

    def _serve(self, res: Res, ns, name, sub, query, raw, headers) -> tuple[int, object]:
        store, method = self.server.api.store, self.command
        manager = query.get("fieldManager") or (self.headers.get("User-Agent") or "unknown").split("/")[0]
        if name is None and method == "GET":
            return 200, self._list(res, ns, query)
        if name is None and method == "POST" and ns is not None:
            return 201, store.create(res, ns, self._json(raw), manager=manager)
        if name is not None and method == "GET":
            obj = store.get(res, ns, name)
            return 200, self._log(obj, query) if sub == "log" else obj
        if name is not None and sub is None and method == "PUT":
            return 200, store.replace(res, ns, name, self._json(raw), manager=manager)
        if name is not None and sub is None and method == "PATCH":
            existed = store.key(res, ns, name) in store.data[res.plural]
            ctype, force = self.headers.get("Content-Type") or "", query.get("force") == "true"
            obj = store.patch(
                res, ns, name, self._json(raw), ctype, manager=query.get("fieldManager", ""), force=force
            )
            return 200 if existed else 201, obj
        if name is not None and sub is None and method == "DELETE":
            options = self._json(raw) if raw else {}
            policy = query.get("propagationPolicy") or options.get("propagationPolicy")
            if not policy and options.get("orphanDependents") is not None:
                policy = "Orphan" if options["orphanDependents"] else "Background"
            if res.plural == "jobs" and not policy:
                headers["Warning"] = JOB_DELETE_WARNING
            grace = query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
            grace = None if grace is None else int(grace)
            preconditions = options.get("preconditions") or {}
            for key, field in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
                wanted = preconditions.get(key)
                if wanted is not None and wanted != (actual := store.get(res, ns, name)["metadata"][key]):
                    why = f'Operation cannot be fulfilled on {res.qualified} "{name}": Precondition failed: '
                    why += f"{field} in precondition: {wanted}, {field} in object meta: {actual}"
                    raise ApiError(409, "Conflict", why, details(res, name))
            return 200, self.server.api.cluster.delete(res, ns, name, policy, grace)
        why = "the server does not allow this method on the requested resource"
        raise ApiError(405, "MethodNotAllowed", why)

    def _list(self, res: Res, ns, query: dict) -> dict:
        store = self.server.api.store
        items = store.list(res, ns, query.get("labelSelector", ""), query.get("fieldSelector", ""))
        if res.group != "kueue.x-k8s.io":  # built-in lists leave kind and apiVersion off their items
            items = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in items]
        meta = {"resourceVersion": str(store.rv)}
        start, limit = int(query.get("continue") or 0), int(query.get("limit") or 0)
        if limit and start + limit < len(items):
            meta |= {"continue": str(start + limit), "remainingItemCount": len(items) - start - limit}
        items = items[start : start + limit] if limit else items[start:]
        return {"kind": f"{res.kind}List", "apiVersion": res.api_version, "metadata": meta, "items": items}

    def _log(self, pod: dict, query: dict) -> bytes:
        name, names = pod["metadata"]["name"], [c.get("name") for c in pod["spec"].get("containers", [])]
        container = query.get("container") or names[0]
        if container not in names:
            raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {name}")
        if not pod["status"].get("containerStatuses"):
            why = f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating'
            raise ApiError(400, "BadRequest", why)
        data = self.server.api.cluster.read_log(pod)
        if query.get("tailLines"):
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[max(len(lines) - int(query["tailLines"]), 0) :])
        return data[: int(query["limitBytes"])] if query.get("limitBytes") else data

    @staticmethod
    def _json(raw: bytes):
        try:
            return json.loads(raw or b"{}")
        except ValueError as exc:
            why = f"the body of the request could not be decoded: {exc}"
            raise ApiError(400, "BadRequest", why) from None
