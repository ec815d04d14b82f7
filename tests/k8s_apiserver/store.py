"""The object store: resource registry, metadata, selectors, patches, the validation of extended resources,
ResourceQuota admission, Status errors."""

from __future__ import annotations

import copy
import re
import secrets
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction


@dataclass(frozen=True)
class Res:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:  # how Status messages name a resource: "jobs.batch", "pods"
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCES = [
    Res("", "v1", "namespaces", "Namespace", namespaced=False),
    Res("", "v1", "nodes", "Node", namespaced=False),
    Res("", "v1", "pods", "Pod"),
    Res("", "v1", "services", "Service"),
    Res("", "v1", "events", "Event"),
    Res("", "v1", "resourcequotas", "ResourceQuota"),
    Res("", "v1", "limitranges", "LimitRange"),
    Res("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False),
    Res("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy"),
    Res("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim"),
    Res("batch", "v1", "jobs", "Job"),
    Res("kueue.x-k8s.io", "v1beta1", "localqueues", "LocalQueue"),
    Res("kueue.x-k8s.io", "v1beta1", "clusterqueues", "ClusterQueue", namespaced=False),
    Res("kueue.x-k8s.io", "v1beta1", "resourceflavors", "ResourceFlavor", namespaced=False),
]
BY_PATH = {(r.api_version, r.plural): r for r in RESOURCES}
BY_NAME = {**{r.kind: r for r in RESOURCES}, **{r.plural: r for r in RESOURCES}}
TERMINAL = ("Succeeded", "Failed")
PATCH_TYPES = (
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
)
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = rf"{_LABEL}(\.{_LABEL})*"
_QUALIFIED_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    f"end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '{_LABEL}')"
)
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    f"'{_SUBDOMAIN}')"
)
_NOT_OWNED = {
    (): {"apiVersion", "kind", "status"},
    ("metadata",): {"name", "namespace", "resourceVersion", "uid"},
}
_KEPT = ("uid", "creationTimestamp", "namespace", "generation", "deletionTimestamp", "resourceVersion")
_CONTAINERS = {"pods": ("spec", "containers"), "jobs": ("spec", "template", "spec", "containers")}
_JOB_DEFAULTS = {"parallelism": 1, "backoffLimit": 6, "completionMode": "NonIndexed", "suspend": False}
_QUEUE_REF = ("spec", "clusterQueue")
_LATEST = "please apply your changes to the latest version and try again"
_SUFFIX = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1)}
_SUFFIX |= {s: Fraction(1000**i) for i, s in enumerate("kMGTPE", 1)}
_SUFFIX |= {s + "i": Fraction(1024**i) for i, s in enumerate("KMGTPE", 1)}


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """Becomes a v1 Status body, worded as the real API server words it."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
        body |= {"message": self.message, "reason": self.reason, "details": self.details, "code": self.code}
        return {k: v for k, v in body.items() if v is not None}


def details(res: Res, name: str, kind: str = "") -> dict:
    return {k: v for k, v in {"name": name, "group": res.group, "kind": kind or res.plural}.items() if v}


def not_found(res: Res, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{res.qualified} "{name}" not found', details(res, name))


def forbidden(res: Res, name: str, why: str) -> ApiError:
    return ApiError(403, "Forbidden", f'{res.qualified} "{name}" is forbidden: {why}', details(res, name))


def invalid(res: Res, name: str, field: str, why: str) -> ApiError:
    return invalid_fields(res, name, [(field, why)])


def invalid_fields(res: Res, name: str, errors: list[tuple[str, str]]) -> ApiError:
    """422 for one or more (field, why): several are listed in brackets, as the API server's aggregate is."""
    reasons = {"Required value": "FieldValueRequired", "Invalid value": "FieldValueInvalid"}
    causes = [
        {"reason": reasons.get(why.split(":")[0], "FieldValueInvalid"), "message": why, "field": field}
        for field, why in errors
    ]
    listed = ", ".join(f"{field}: {why}" for field, why in errors)
    listed = listed if len(errors) == 1 else f"[{listed}]"
    message = f'{res.kind}{"." * bool(res.group)}{res.group} "{name}" is invalid: {listed}'
    return ApiError(422, "Invalid", message, details(res, name, res.kind) | {"causes": causes})


def parse_quantity(value) -> Fraction:
    m = re.fullmatch(r"([+-]?[0-9.]+)(?:[eE]([+-]?\d+)|([a-zA-Z]*))", str(value).strip())
    if not m or (m.group(3) or "") not in _SUFFIX:
        raise ApiError(400, "BadRequest", f"quantities must match the regular expression: {value!r}")
    base = Fraction(m.group(1))
    return base * Fraction(10) ** int(m.group(2)) if m.group(2) else base * _SUFFIX[m.group(3) or ""]


def format_quantity(value: Fraction, binary: bool = False) -> str:
    if value.denominator != 1:
        return f"{int(value * 1000)}m" if (value * 1000).denominator == 1 else str(float(value))
    n = int(value)
    exp = next((i for i in range(6, 0, -1) if binary and n and n % 1024**i == 0), 0)
    return f"{n // 1024**exp}{'KMGTPE'[exp - 1]}i" if exp else str(n)


def parse_label_selector(text: str) -> list[tuple[str, str, str | None]]:
    """Equality-based terms joined by commas: a=b, a==b, a!=b, a (exists), !a (does not exist)."""
    terms = []
    for raw in filter(None, (t.strip() for t in (text or "").split(","))):
        m = re.fullmatch(r"(!?)([\w./-]+)\s*(?:(==|=|!=)\s*([\w.-]*))?", raw)
        if not m or (m.group(1) and m.group(3)):
            raise ApiError(400, "BadRequest", f"unable to parse requirement: found '{raw}'")
        op = "!" if m[1] else {"==": "=", None: "exists"}.get(m[3], m[3])
        terms.append((m[2], op, m[4]))
    return terms


def labels_match(labels: dict, terms) -> bool:
    checks = {"=": lambda k, v: labels.get(k) == v, "!=": lambda k, v: labels.get(k) != v}
    checks |= {"exists": lambda k, v: k in labels, "!": lambda k, v: k not in labels}
    return all(checks[op](key, value) for key, op, value in terms)


def get_in(obj, path):
    for part in path:
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def fields_match(obj: dict, text: str) -> bool:
    """Field selectors on any dotted path: metadata.name=x, status.phase!=Failed, involvedObject.uid=..."""
    for term in filter(None, (t.strip() for t in (text or "").split(","))):
        m = re.fullmatch(r"([\w.]+)\s*(==|=|!=)\s*(.*)", term)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid selector: '{text}'; can't understand '{term}'")
        value = get_in(obj, m.group(1).split("."))
        if (("" if value is None else str(value)) == m.group(3)) == (m.group(2) == "!="):
            return False
    return True


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch (null deletes a key)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def leaf_paths(obj, prefix=()) -> set[tuple]:
    """The fields a body sets (lists are atomic); what server-side apply tracks owners of."""
    if not isinstance(obj, dict) or not obj:
        return {prefix} if prefix else set()
    skip = _NOT_OWNED.get(prefix, ())
    return set().union(*(leaf_paths(v, (*prefix, k)) for k, v in obj.items() if k not in skip))


def is_extended(name: str) -> bool:
    """An extended resource (nvidia.com/gpu, nvidia.com/mig-3g.71gb, hygon.com/dcumem…): a name with a
    domain outside kubernetes.io, as the API server's helper.IsExtendedResourceName tells them."""
    domain, slash, rest = name.partition("/")
    native = not slash or domain == "kubernetes.io" or domain.endswith(".kubernetes.io")
    qualified = re.fullmatch(_SUBDOMAIN, f"requests.{domain}") and re.fullmatch(_QUALIFIED_NAME, rest)
    return not native and not name.startswith("requests.") and bool(qualified)


def pod_usage(pod: dict) -> dict[str, Fraction]:
    """What a pod counts against quota: pods, requests.X, X (= requests.X), limits.X; an extended resource
    counts as requests.X only (the quota evaluator tracks no limits.X or bare X of one: no overcommit)."""
    usage = {"pods": Fraction(1), "count/pods": Fraction(1)}
    for c in pod.get("spec", {}).get("containers", []):
        for kind in ("requests", "limits"):
            for name, q in ((c.get("resources") or {}).get(kind) or {}).items():
                if is_extended(name):
                    keys = {f"requests.{name}"} if kind == "requests" else set()
                else:
                    keys = {f"{kind}.{name}", name if kind == "requests" else f"{kind}.{name}"}
                for key in keys:
                    usage[key] = usage.get(key, Fraction(0)) + parse_quantity(q)
    return usage


def resource_errors(containers: list | None, path: str) -> list[tuple[str, str]]:
    """(field, why) for each extended resource a container asks for wrongly, worded as the API server's
    validation words it: whole numbers, not negative, a limit always, a request equal to the limit."""
    errors = []
    for i, c in enumerate(containers or []):
        resources, where = c.get("resources") or {}, f"{path}[{i}].resources"
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        for kind, values in (("limits", limits), ("requests", requests)):
            for name, q in sorted(values.items()):
                value = parse_quantity(q)
                if is_extended(name) and value.denominator != 1:
                    errors.append((f"{where}.{kind}[{name}]", f'Invalid value: "{q}": must be an integer'))
                elif value < 0:
                    why = f'Invalid value: "{q}": must be greater than or equal to 0'
                    errors.append((f"{where}.{kind}[{name}]", why))
        for name, q in sorted(requests.items()):
            if not is_extended(name):
                continue
            if name not in limits:
                why = "Required value: Limit must be set for non overcommitable resources"
                errors.append((f"{where}.limits[{name}]", why))
            elif parse_quantity(q) != parse_quantity(limits[name]):
                why = f'Invalid value: "{q}": must be equal to {name} limit of {limits[name]}'
                errors.append((f"{where}.requests[{name}]", why))
    return errors


class Store:
    """Every object, keyed by plural then (namespace, name); one RLock guards it all."""

    def __init__(self, nodes: list[dict] | None = None):
        self.lock = threading.RLock()
        self.rv = 0
        self.data: dict[str, dict[tuple[str, str], dict]] = {r.plural: {} for r in RESOURCES}
        self.owners: dict[tuple, dict[tuple, str]] = {}  # (plural, ns, name) → field path → field manager
        for ns in ("default", "kube-system"):
            self.create(BY_NAME["namespaces"], "", {"metadata": {"name": ns}})
        for node in nodes or [{"name": "node-0"}]:
            capacity = {"cpu": "64", "memory": "256Gi", "pods": "110"} | node.get("capacity", {})
            status = {"capacity": capacity, "allocatable": node.get("allocatable", capacity)}
            status["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
            meta = {"name": node["name"], "labels": node.get("labels", {})}
            spec = {"taints": node.get("taints", [])}
            self.create(BY_NAME["nodes"], "", {"metadata": meta, "spec": spec, "status": status})

    def next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def key(self, res: Res, ns: str | None, name: str) -> tuple[str, str]:
        return (ns or "" if res.namespaced else "", name)

    def get(self, res: Res, ns: str, name: str) -> dict:
        obj = self.data[res.plural].get(self.key(res, ns, name))
        if obj is None:
            raise not_found(res, name)
        return obj

    def list(self, res: Res, ns: str | None, labels: str = "", fields: str = "") -> list[dict]:
        terms = parse_label_selector(labels)
        with self.lock:
            return [
                o
                for (o_ns, _), o in sorted(self.data[res.plural].items())
                if (ns is None or o_ns == ns)
                and labels_match(o["metadata"].get("labels") or {}, terms)
                and fields_match(o, fields)
            ]

    def objects(self, kind: str) -> list[dict]:
        with self.lock:
            return copy.deepcopy(self.list(BY_NAME[kind], None))

    def create(self, res: Res, ns: str, body: dict, *, manager: str = "") -> dict:
        with self.lock:
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                suffix = "".join(
                    secrets.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5)
                )  # k8s' alphabet
                meta["name"] = meta["generateName"] + suffix
            name = meta.get("name") or ""
            label = res.plural in ("namespaces", "services") or (res.plural == "jobs" and len(name) > 63)
            pattern, why, limit = (_LABEL, _LABEL_MSG, 63) if label else (_SUBDOMAIN, _SUBDOMAIN_MSG, 253)
            if not name:
                raise invalid(res, name, "metadata.name", "Required value: name or generateName is required")
            if len(name) > limit or not re.fullmatch(pattern, name):
                why = f"must be no more than {limit} characters" if len(name) > limit else why
                raise invalid(res, name, "metadata.name", f'Invalid value: "{name}": {why}')
            if res.namespaced and meta.get("namespace", ns) != ns:
                why = "the namespace of the provided object does not match the namespace sent on the request"
                raise ApiError(400, "BadRequest", why)
            if res.namespaced and ("", ns) not in self.data["namespaces"]:
                raise not_found(BY_NAME["namespaces"], ns)
            if self.key(res, ns, name) in self.data[res.plural]:
                why = f'{res.qualified} "{name}" already exists'
                raise ApiError(409, "AlreadyExists", why, details(res, name))
            obj |= {"apiVersion": res.api_version, "kind": res.kind}
            meta |= {"uid": str(uuid.uuid4()), "creationTimestamp": now_iso(), "generation": 1}
            meta |= {"namespace": ns} if res.namespaced else {}
            self._default(res, obj)
            policy = get_in(obj, ("spec", "template", "spec", "restartPolicy"))
            if res.plural == "jobs" and policy not in ("OnFailure", "Never"):
                why = 'Required value: valid values: "OnFailure", "Never"'
                raise invalid(res, name, "spec.template.spec.restartPolicy", why)
            # the containers' resources are validated before the quota's admission, as the API server does
            path = _CONTAINERS.get(res.plural)
            if path and (errors := resource_errors(get_in(obj, path), ".".join(path))):
                raise invalid_fields(res, name, errors)
            requested = pod_usage(obj) if res.plural == "pods" else {"count/jobs.batch": Fraction(1)}
            if res.plural in ("pods", "jobs"):
                self.check_quota(res, ns, name, requested)
            meta["resourceVersion"] = self.next_rv()
            self.data[res.plural][self.key(res, ns, name)] = obj
            self.owners[(res.plural, *self.key(res, ns, name))] = dict.fromkeys(leaf_paths(body), manager)
            return obj

    def replace(self, res: Res, ns: str, name: str, body: dict, *, manager: str = "", owned=None) -> dict:
        with self.lock:
            old, new = self.get(res, ns, name), copy.deepcopy(body)
            meta = new.setdefault("metadata", {})
            if meta.get("name", name) != name:
                raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
            if meta.get("resourceVersion") not in (None, old["metadata"]["resourceVersion"]):
                why = f'Operation cannot be fulfilled on {res.qualified} "{name}": the object has been modified; '
                raise ApiError(409, "Conflict", why + _LATEST, details(res, name))
            meta |= {"name": name} | {k: old["metadata"][k] for k in _KEPT if k in old["metadata"]}
            new |= {"apiVersion": res.api_version, "kind": res.kind}
            new |= {"status": old["status"]} if "status" in old else {}  # the controllers own status
            if res.plural == "localqueues" and get_in(new, _QUEUE_REF) != get_in(old, _QUEUE_REF):
                # Kueue's CRD validation (x-kubernetes-validations: self == oldSelf)
                raise invalid(res, name, "spec.clusterQueue", 'Invalid value: "string": field is immutable')
            if new.get("spec") != old.get("spec"):
                meta["generation"] += 1
            owners = self.owners.setdefault((res.plural, *self.key(res, ns, name)), {})
            owners |= dict.fromkeys(leaf_paths(body if owned is None else owned), manager)
            if new != old:
                meta["resourceVersion"] = self.next_rv()
                self.data[res.plural][self.key(res, ns, name)] = new
            return self.data[res.plural][self.key(res, ns, name)]

    def patch(self, res: Res, ns: str, name: str, body, ctype: str, *, manager: str, force: bool) -> dict:
        """Merge and strategic merge (treated as merge) patches; server-side apply (create-or-merge)."""
        if ctype.split(";")[0].strip() not in PATCH_TYPES:
            why = f"the body of the request was in an unknown format - accepted media types include: {', '.join(PATCH_TYPES)}"
            raise ApiError(415, "UnsupportedMediaType", why)
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the patch body must be a JSON object")
        with self.lock:
            if not ctype.startswith("application/apply-patch"):
                merged = merge_patch(self.get(res, ns, name), body)
                return self.replace(res, ns, name, merged, manager=manager, owned=body)
            if not manager:
                why = 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch'
                raise ApiError(422, "Invalid", why)
            if self.key(res, ns, name) not in self.data[res.plural]:
                return self.create(res, ns, merge_patch(body, {"metadata": {"name": name}}), manager=manager)
            current = self.data[res.plural][self.key(res, ns, name)]
            owners = self.owners.get((res.plural, *self.key(res, ns, name)), {})
            conflicts = [
                f'conflict with "{owners[p]}" using {res.api_version}: .{".".join(p)}'
                for p in sorted(leaf_paths(body))
                if owners.get(p) not in ("", None, manager) and get_in(current, p) != get_in(body, p)
            ]
            if conflicts and not force:
                why = f"Apply failed with {len(conflicts)} conflict{'s' * (len(conflicts) > 1)}: {'; '.join(conflicts)}"
                causes = [{"reason": "FieldManagerConflict", "message": c} for c in conflicts]
                raise ApiError(409, "Conflict", why, details(res, name) | {"causes": causes})
            return self.replace(res, ns, name, merge_patch(current, body), manager=manager, owned=body)

    def update_status(self, obj: dict, status: dict) -> None:
        """A controller's status write: bumps resourceVersion only on change."""
        if obj.get("status") != status:
            obj["status"] = status
            obj["metadata"]["resourceVersion"] = self.next_rv()

    def remove(self, res: Res, ns: str, name: str) -> dict | None:
        self.owners.pop((res.plural, *self.key(res, ns, name)), None)
        return self.data[res.plural].pop(self.key(res, ns, name), None)

    def _default(self, res: Res, obj: dict) -> None:
        if res.plural == "namespaces":
            obj["status"] = {"phase": "Active"}
        elif res.plural == "pods":
            spec = obj.setdefault("spec", {})
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            for c in spec.get("containers", []):  # API defaulting: requests default to limits
                r = c.setdefault("resources", {})
                if r.get("limits"):
                    r["requests"] = r["limits"] | (r.get("requests") or {})
            obj["status"] = {"phase": "Pending"}
        elif res.plural == "persistentvolumeclaims":  # bound at once, as if a provisioner were quick
            spec = obj.setdefault("spec", {})
            spec.setdefault("volumeMode", "Filesystem")
            size = get_in(spec, ("resources", "requests", "storage"))
            obj["status"] = {"phase": "Bound", "accessModes": list(spec.get("accessModes") or [])}
            obj["status"] |= {"capacity": {"storage": size}} if size else {}
        elif res.plural == "jobs":
            meta, spec = obj["metadata"], obj.setdefault("spec", {})
            if spec.get("completions") is None and spec.get("parallelism") is None:
                spec["completions"] = 1
            spec |= {k: v for k, v in _JOB_DEFAULTS.items() if spec.get(k) is None}
            spec.setdefault("selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": meta["uid"]}})
            tmeta = spec.setdefault("template", {}).setdefault("metadata", {})
            labels = {"batch.kubernetes.io/controller-uid": meta["uid"], "controller-uid": meta["uid"]}
            labels |= {"batch.kubernetes.io/job-name": meta["name"], "job-name": meta["name"]}
            tmeta["labels"] = (tmeta.get("labels") or {}) | labels
            obj["status"] = {}

    def quota_used(self, ns: str) -> dict[str, Fraction]:
        used = {"count/jobs.batch": Fraction(len(self.list(BY_NAME["jobs"], ns)))}
        for pod in self.list(BY_NAME["pods"], ns):
            if pod["status"].get("phase") not in TERMINAL and not pod["metadata"].get("deletionTimestamp"):
                for key, value in pod_usage(pod).items():
                    used[key] = used.get(key, Fraction(0)) + value
        return used

    def check_quota(self, res: Res, ns: str, name: str, requested: dict[str, Fraction]) -> None:
        """The ResourceQuota admission plugin: refuse what would take any quota of the namespace over."""
        used = self.quota_used(ns)
        for quota in self.list(BY_NAME["resourcequotas"], ns):
            hard = quota.get("spec", {}).get("hard") or {}
            asked = [k for k in sorted(hard) if requested.get(k, 0) > 0]
            over = [k for k in asked if used.get(k, 0) + requested[k] > parse_quantity(hard[k])]
            if over:
                why = f"exceeded quota: {quota['metadata']['name']}, requested: {_pairs(requested, over, hard)}, "
                why += f"used: {_pairs(used, over, hard)}, limited: " + ",".join(
                    f"{k}={hard[k]}" for k in over
                )
                raise forbidden(res, name, why)


def _pairs(values: dict, keys: list[str], hard: dict) -> str:
    return ",".join(
        f"{k}={format_quantity(values.get(k, Fraction(0)), str(hard[k]).endswith('i'))}" for k in keys
    )
