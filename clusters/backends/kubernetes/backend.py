"""KubernetesBackend: jobs as batch/v1 Jobs, tenants as namespaces (docs/architecture.md, Backends).

backend id = "<namespace>/pj-<token>". submit creates the Job (and, for several nodes, the
headless Service of its rendezvous); a retry that meets 409 AlreadyExists adopts the Job that
carries the same token. poll lists Jobs by label, once, whatever the number of jobs, plus at
most one pods list and one events list. cancel deletes the Job with foreground propagation: while
Kubernetes deletes its pods the Job still exists, with a deletionTimestamp, and poll reports it
CANCELLED; once it is gone poll leaves it out, like any Job the cluster no longer knows (the
portal's LOST after its grace period), so a cancelled job is CANCELLED when a poll ran during the
deletion (seconds: the pods' termination grace). warn (a preemptible job's GPUs are taken back)
deletes the Job in the background instead: it is gone at once, which the portal reads as the end of
a preempted attempt, while its pods get SIGTERM and their grace to save a checkpoint.
"""

from __future__ import annotations

import copy
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from clusters.backends.base import (
    END_STATES,
    Backend,
    BackendError,
    BackendUnavailable,
    ClusterConfig,
    GpuSample,
    Health,
    JobRef,
    JobSpec,
    JobStatus,
    LogTail,
    PartitionInfo,
    PurgeReport,
    SchedulerJob,
    TenantLimits,
)
from clusters.backends.kubernetes import states
from clusters.backends.kubernetes.client import Api, api_client
from clusters.backends.kubernetes.common import (
    GPU_RESOURCES,
    JOB_PREFIX,
    MANAGED_BY,
    MANAGED_BY_KEY,
    MANAGED_SELECTOR,
    backend_id,
    check_namespace,
    check_token,
    job_name,
    parse_backend_id,
)
from clusters.backends.kubernetes.kueue import KUEUE_GROUP, KUEUE_VERSION, cluster_queue_name
from clusters.backends.kubernetes.manifests import (
    COMPLETION_INDEX_KEY,
    CONTAINER,
    LABEL_TOKEN,
    job_manifest,
    rendezvous_service_manifest,
)
from clusters.backends.kubernetes.tenant import keep_revoked, tenant_manifests

logger = logging.getLogger(__name__)

PLURALS = {
    "Namespace": "namespaces",
    "ResourceQuota": "resourcequotas",
    "LimitRange": "limitranges",
    "Service": "services",
    "Job": "jobs",
    "NetworkPolicy": "networkpolicies",
    "PriorityClass": "priorityclasses",
    "LocalQueue": "localqueues",
    "WorkloadPriorityClass": "workloadpriorityclasses",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "ClusterQueue": "clusterqueues",
    "ResourceFlavor": "resourceflavors",
}
FAILED_CREATE = "involvedObject.kind=Job,reason=FailedCreate"
# Jobs deleted by one delete_finished call at most, oldest first: a backlog (a cluster that never
# honoured ttlSecondsAfterFinished) goes over a few runs, each within its task's time limit.
DELETE_BATCH = 500
LOG_ATTEMPTS = 3  # log reads: each bounded by max_bytes; fewer lines when the lines are long
# warn() deletes the Job only as it read it (its resourceVersion): a Job that changed meanwhile
# (its pods' progress, or its end) is read again, a few times at most.
WARN_ATTEMPTS = 5


def path(api_version: str, plural: str, namespace: str = "", name: str = "") -> str:
    """The REST path of a collection or an object; the names in it are checked DNS names."""
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return (
        root + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}" + (f"/{name}" if name else "")
    )


def contains(actual: Any, desired: Any) -> bool:
    """Whether `actual` (what the server holds) already has everything `desired` sets."""
    if isinstance(desired, dict):
        if not desired:
            return actual in (None, {})
        return isinstance(actual, dict) and all(contains(actual.get(k), v) for k, v in desired.items())
    if isinstance(desired, list):
        if not desired:
            return actual in (None, [])
        return (
            isinstance(actual, list) and len(actual) == len(desired) and all(map(contains, actual, desired))
        )
    if isinstance(desired, bool) or isinstance(actual, bool):
        return actual is desired
    return actual == desired or (actual is not None and str(actual) == str(desired))


def overlay(current: dict, desired: dict) -> dict:
    """The object to PUT: the server's, with our labels and annotations merged in and our other
    top-level fields (spec, value…) in place of its own."""
    merged = copy.deepcopy(current)
    meta, wanted = merged.setdefault("metadata", {}), desired.get("metadata", {})
    for key in ("labels", "annotations"):
        if wanted.get(key):
            meta[key] = {**(meta.get(key) or {}), **wanted[key]}
    for key, value in desired.items():
        if key not in ("apiVersion", "kind", "metadata", "status"):
            merged[key] = copy.deepcopy(value)
    return merged


class KubernetesBackend(Backend):
    """The official client against one cluster's API server."""

    def __init__(self, config: ClusterConfig, *, connect_timeout_s: float = 5, request_timeout_s: float = 30):
        self.config = config
        self.timeout = (connect_timeout_s, request_timeout_s)
        self._api: Api | None = None

    @property
    def api(self) -> Api:
        if self._api is None:
            self._api = Api(api_client(self.config), self.timeout)
        return self._api

    def _list(
        self, what: str, plural: str, namespaces: set[str], api_version: str = "v1", **query: Any
    ) -> list:
        """One list call: in the namespace when there is one, across all of them otherwise."""
        namespace = next(iter(namespaces)) if len(namespaces) == 1 else ""
        _status, body = self.api.request(what, "GET", path(api_version, plural, namespace), query=query)
        return body.get("items") or []

    # ------------------------------------------------------------------- jobs --
    def submit(self, spec: JobSpec) -> str:
        manifest = job_manifest(spec, self.config)
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        what = f"create Job {namespace}/{name}"
        status, job = self.api.request(
            what, "POST", path("batch/v1", "jobs", namespace), body=manifest, allow=(404, 409)
        )
        if status == 404:
            raise BackendError(
                f"{what}: namespace {namespace} does not exist: apply the tenant to the cluster first"
            )
        if status == 409:  # an earlier attempt created it: adopt it if it is this job's
            _status, job = self.api.request(
                f"read Job {namespace}/{name}", "GET", path("batch/v1", "jobs", namespace, name)
            )
            if (job["metadata"].get("labels") or {}).get(LABEL_TOKEN) != spec.token:
                raise BackendError(f"{what}: a Job of that name exists and is not this job's")
        self._ensure_rendezvous(job)
        return backend_id(namespace, name)

    def _ensure_rendezvous(self, job: dict) -> None:
        """The headless Service of an Indexed Job; created after the Job so that the Job owns it,
        and again by find() when an earlier attempt stopped between the two."""
        if (job.get("spec") or {}).get("completionMode") != "Indexed":
            return
        meta = job["metadata"]
        service = rendezvous_service_manifest(
            meta["namespace"], meta["name"], meta.get("labels") or {}, meta.get("uid", "")
        )
        what = f"create Service {meta['namespace']}/{meta['name']}"
        self.api.request(what, "POST", path("v1", "services", meta["namespace"]), body=service, allow=(409,))

    def find(self, token: str, *, account: str = "", user: str = "") -> str | None:
        """The portal's Job of this token, in the tenant's namespace when `account` names it: a
        Job of that name in another namespace is not the tenant's job."""
        name = job_name(token)
        jobs = self._list(
            "find Job", "jobs", set(), "batch/v1", labelSelector=f"{LABEL_TOKEN}={check_token(token)}"
        )
        for job in jobs:
            if job["metadata"]["name"] == name and account in ("", job["metadata"]["namespace"]):
                self._ensure_rendezvous(job)
                return backend_id(job["metadata"]["namespace"], name)
        return None

    def poll(self, backend_ids: list[str]) -> dict[str, JobStatus]:
        """One Jobs list by label; one pods list when a Job's pods can tell more; one events list
        when a Job has no pods yet. Three calls at most, whatever the number of jobs."""
        wanted = {parse_backend_id(bid) for bid in backend_ids}
        if not wanted:
            return {}
        namespaces = {namespace for namespace, _name in wanted}
        found = {
            key: job
            for job in self._list("list Jobs", "jobs", namespaces, "batch/v1", labelSelector=MANAGED_SELECTOR)
            if (key := (job["metadata"].get("namespace", ""), job["metadata"]["name"])) in wanted
        }
        pods: dict[tuple[str, str], list[dict]] = {}
        if any(states.needs_pods(job) for job in found.values()):
            for pod in self._list("list pods", "pods", namespaces, labelSelector=MANAGED_SELECTOR):
                token = (pod["metadata"].get("labels") or {}).get(LABEL_TOKEN, "")
                pods.setdefault((pod["metadata"].get("namespace", ""), JOB_PREFIX + token), []).append(pod)
        events: dict[tuple[str, str], list[dict]] = {}
        if any(states.needs_events(job, pods.get(key, [])) for key, job in found.items()):
            for event in self._list("list events", "events", namespaces, fieldSelector=FAILED_CREATE):
                target = event.get("involvedObject") or {}
                if target.get("kind") == "Job" and event.get("reason") == "FailedCreate":
                    events.setdefault((target.get("namespace", ""), target.get("name", "")), []).append(event)
        return {
            backend_id(*key): states.job_status(job, pods.get(key, []), events.get(key, []))
            for key, job in found.items()
        }

    def cancel(self, backend_id: str, *, user: str = "") -> None:
        namespace, name = parse_backend_id(backend_id)
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}
        self.api.request(
            f"delete Job {backend_id}",
            "DELETE",
            path("batch/v1", "jobs", namespace, name),
            query={"propagationPolicy": "Foreground"},
            body=body,
            allow=(404,),  # gone already
        )

    def warn(self, backend_id: str, *, user: str = "", grace_s: int = 0) -> None:
        """Delete the Job in the background, so that it is gone at once (the end of a preempted
        attempt, for the portal) while the garbage collector deletes its pods: the kubelet sends
        their main process SIGTERM, then SIGKILL once their terminationGracePeriodSeconds is out.
        That grace is the pod's own (JobSpec.grace_s, set when the job was submitted): Kubernetes
        does not pass a Job's DeleteOptions on to its pods, so grace_s here is sent for the record.
        A Job that is gone, has ended (or its controller has decided so), is being deleted
        (cancel) or waits suspended (Kueue has not admitted it) is left as it is; the delete holds
        only for the Job as it was read (uid and resourceVersion), so a Job that ended meanwhile is
        never taken for a preempted one."""
        namespace, name = parse_backend_id(backend_id)
        if isinstance(grace_s, bool) or not isinstance(grace_s, int) or grace_s < 0:
            raise BackendError(f"invalid grace period in seconds {grace_s!r}")
        job_path = path("batch/v1", "jobs", namespace, name)
        for _attempt in range(WARN_ATTEMPTS):
            status, job = self.api.request(f"read Job {backend_id}", "GET", job_path, allow=(404,))
            meta = job.get("metadata") or {}
            if (
                status == 404
                or states.ending(job)
                or meta.get("deletionTimestamp")
                or (job.get("spec") or {}).get("suspend")
            ):
                return
            options = {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "propagationPolicy": "Background",
                "gracePeriodSeconds": grace_s,
                "preconditions": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
            }
            status, _body = self.api.request(
                f"delete Job {backend_id}",
                "DELETE",
                job_path,
                query={"propagationPolicy": "Background", "gracePeriodSeconds": grace_s},
                body=options,
                allow=(404, 409),  # gone already; 409: it changed since it was read
            )
            if status != 409:
                return
        raise BackendUnavailable(f"warn {backend_id}: the Job changed at each of {WARN_ATTEMPTS} attempts")

    def log_tail(self, job: JobRef, *, lines: int, max_bytes: int) -> LogTail:
        """The log of the job's pod (pod 0 of an Indexed Job), at most max_bytes per read. The
        API server's limitBytes keeps the first bytes of the tail asked for, so when the lines
        are too long for the limit, the tail is asked again with fewer lines."""
        namespace, name = parse_backend_id(job.backend_id)
        if lines <= 0 or max_bytes <= 0:
            return LogTail(lines=[], truncated=False)
        token = name.removeprefix(JOB_PREFIX)
        pods = self._list("list pods", "pods", {namespace}, labelSelector=f"{LABEL_TOKEN}={token}")
        pods = [p for p in pods if (p["metadata"].get("labels") or {}).get(LABEL_TOKEN) == token]
        if not pods:
            return LogTail(lines=[], truncated=False)

        def rank(pod: dict) -> tuple:
            meta = pod["metadata"]
            index = (meta.get("annotations") or {}).get(COMPLETION_INDEX_KEY) or (
                meta.get("labels") or {}
            ).get(COMPLETION_INDEX_KEY, "0")
            return (index == "0", meta.get("creationTimestamp") or "")

        pod_name = max(pods, key=rank)["metadata"]["name"]
        tail, what = lines + 1, f"read the log of pod {namespace}/{pod_name}"
        for attempt in range(1, LOG_ATTEMPTS + 1):
            query = {"container": CONTAINER, "tailLines": tail, "limitBytes": max_bytes}
            status, response = self.api.request(
                what,
                "GET",
                path("v1", "pods", namespace, f"{pod_name}/log"),
                query=query,
                allow=(400, 404),
                stream=True,
            )
            if status in (400, 404):  # the container has not started, or the pod is gone
                return LogTail(lines=[], truncated=False)
            try:
                data = response.read(max_bytes + 1)  # whatever the server does with limitBytes
            finally:
                response.release_conn()
            capped = len(data) >= max_bytes
            text = data[:max_bytes].decode(errors="replace").splitlines()
            if capped and len(text) > 1:
                text = text[:-1]  # the last line was cut by the limit
            if not capped or tail == 1 or attempt == LOG_ATTEMPTS:
                keep = text[-lines:]
                return LogTail(lines=keep, truncated=capped or len(text) > lines or tail <= lines)
            tail = max(1, min(tail - 1, len(text)))  # as many lines as fitted, from the end this time
        raise AssertionError("unreachable")

    # ---------------------------------------------------------------- cleanup --
    def _portal_jobs(self, accounts: list[str]) -> list[dict]:
        """The portal's Jobs in these namespaces: one list by label, in the namespace when there
        is one, across all of them otherwise."""
        namespaces = set()
        for account in accounts:  # one account that cannot be a namespace spoils no other's
            try:
                namespaces.add(check_namespace(account))
            except BackendError:
                continue
        if not namespaces:
            return []
        jobs = self._list("list Jobs", "jobs", namespaces, "batch/v1", labelSelector=MANAGED_SELECTOR)
        return [job for job in jobs if job["metadata"].get("namespace") in namespaces]

    def list_jobs(self, accounts: list[str]) -> list[SchedulerJob]:
        """The portal's Jobs that have not ended, from one Jobs list: the token is the Job's token
        label when its name is pj-<that token> ("" otherwise); the state is the Job's own (no
        pods list: running or not is all the orphan check needs)."""
        found = []
        for job in self._portal_jobs(accounts):
            meta, status = job["metadata"], states.job_status(job)
            if status.state in END_STATES:  # a Job being deleted (cancel) included: CANCELLED
                continue
            token = (meta.get("labels") or {}).get(LABEL_TOKEN, "")
            token = token if meta["name"] == JOB_PREFIX + token else ""
            found.append(SchedulerJob(status.backend_id, token, meta["namespace"], status.state))
        return found

    def purge_scratch(
        self, account: str, *, older_than_days: int, dry_run: bool, users: tuple[str, ...] = ()
    ) -> PurgeReport:
        """Nothing to purge: a Job's files live in its pods' volumes, which go with its pods (the
        Job's TTL, or delete_finished). The tenant's scratch claim (checkpoints) is read only
        through pods: the portal deletes nothing in it; it goes with the tenant's namespace."""
        check_namespace(account)
        return PurgeReport(deleted=[], refused={}, bytes_freed=0, dry_run=dry_run)

    def delete_finished(
        self,
        accounts: list[str],
        *,
        older_than_s: int,
        dry_run: bool,
        users: dict[str, list[str]] | None = None,
    ) -> list[str]:
        """Delete the portal's Jobs that ended (Complete or Failed) more than older_than_s ago and
        that the cluster kept: its TTL-after-finished controller is off, or behind. One list, then
        one DELETE per Job (at most DELETE_BATCH), Background so that its pods go too, on the
        condition that it is still the Job that was listed (uid). The ids deleted, or due."""
        if isinstance(older_than_s, bool) or not isinstance(older_than_s, int) or older_than_s < 0:
            raise BackendError(f"invalid age in seconds {older_than_s!r}")
        cutoff = datetime.now(UTC) - timedelta(seconds=older_than_s)
        ended = [
            (finished, job)
            for job in self._portal_jobs(accounts)
            if not job["metadata"].get("deletionTimestamp")
            and (finished := states.finished_at(job)) is not None
            and finished < cutoff
        ]
        deleted = []
        for _finished, job in sorted(ended, key=lambda pair: pair[0])[:DELETE_BATCH]:
            meta = job["metadata"]
            bid = backend_id(meta["namespace"], meta["name"])
            if not dry_run:
                options = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
                options["preconditions"] = {"uid": meta["uid"]}
                status, _body = self.api.request(
                    f"delete Job {bid}",
                    "DELETE",
                    path("batch/v1", "jobs", meta["namespace"], meta["name"]),
                    query={"propagationPolicy": "Background"},
                    body=options,
                    allow=(404, 409),  # gone already; 409: another Job of that name since the list
                )
                if status in (404, 409):
                    continue
            deleted.append(bid)
        return deleted

    def gpu_utilization(self, backend_ids: list[str]) -> dict[str, GpuSample]:
        """Not read through the API server: {} (a cluster's Prometheus/DCGM URL may have it)."""
        return {}

    # ----------------------------------------------------------------- cluster --
    def inventory(self) -> list[PartitionInfo]:
        """A partition per GPU product label value: nodes, GPUs per node, and free GPUs =
        allocatable − GPUs requested by the pods of the node that have not ended (one nodes list,
        one pods list). A node that is not Ready or is cordoned has none free."""
        nodes = self._list("list nodes", "nodes", set())
        active = "status.phase!=Succeeded,status.phase!=Failed"
        used: dict[tuple[str, str], float] = {}
        for pod in self._list("list pods", "pods", set(), fieldSelector=active):
            node = (pod.get("spec") or {}).get("nodeName")
            if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            for container in (pod.get("spec") or {}).get("containers") or []:
                resources = container.get("resources") or {}
                amounts = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
                for resource in GPU_RESOURCES:
                    if resource in amounts:
                        used[(node, resource)] = used.get((node, resource), 0) + float(
                            parse_quantity(amounts[resource])
                        )
        partitions: dict[str, PartitionInfo] = {}
        for node in nodes:
            meta, status = node["metadata"], node.get("status") or {}
            ready = any(
                c.get("type") == "Ready" and str(c.get("status")) == "True"
                for c in status.get("conditions") or []
            ) and not (node.get("spec") or {}).get("unschedulable")
            for resource, label in GPU_RESOURCES.items():
                product = (meta.get("labels") or {}).get(label)
                capacity = int(parse_quantity((status.get("capacity") or {}).get(resource, "0")))
                if not product or capacity <= 0:
                    continue
                allocatable = int(parse_quantity((status.get("allocatable") or {}).get(resource, "0")))
                free = max(allocatable - int(used.get((meta["name"], resource), 0)), 0) if ready else 0
                info = partitions.get(product) or PartitionInfo(product, product, 0, 0, 0, None)
                partitions[product] = PartitionInfo(
                    product,
                    product,
                    max(info.gpus_per_node, capacity),
                    info.nodes + 1,
                    info.gpus_free + free,
                    None,
                )
        return sorted(partitions.values(), key=lambda info: info.name)

    def apply_tenant(self, limits: TenantLimits) -> None:
        """Read each object, create what is missing, replace what differs: a second run with the
        same limits only reads. A resource the quota bounded and the limits no longer name (a
        grant of MIG instances that ended) stays in the quota and the limit range at 0."""
        no_workload_priorities = False
        for manifest in tenant_manifests(limits, self.config):
            if not (no_workload_priorities and manifest["kind"] == "WorkloadPriorityClass"):
                no_workload_priorities |= self._ensure(manifest) == "missing"
        if self.config.uses_kueue and not limits.cohort:
            self._drop_cluster_queue(limits.account)

    def _drop_cluster_queue(self, account: str) -> None:
        """The ClusterQueue the tenant had in a cohort, once its LocalQueue feeds the shared one
        again: left in place, its nominal quota would still count in the cohort. Only the
        portal's: a ClusterQueue of that name that an admin made stays. Kueue keeps it (its
        finalizer) until the workloads it admitted have ended."""
        name = cluster_queue_name(account)
        queue_path = path(f"{KUEUE_GROUP}/{KUEUE_VERSION}", "clusterqueues", "", name)
        what = f"ClusterQueue {name}"
        status, queue = self.api.request(f"read {what}", "GET", queue_path, allow=(404,))
        labels = (queue.get("metadata") or {}).get("labels") or {}
        if (
            status == 404
            or labels.get(MANAGED_BY_KEY) != MANAGED_BY
            or queue["metadata"].get("deletionTimestamp")
        ):
            return
        self.api.request(f"delete {what}", "DELETE", queue_path, allow=(404,))

    def _ensure(self, desired: dict) -> str:
        kind, meta = desired["kind"], desired["metadata"]
        namespace, name = meta.get("namespace", ""), meta["name"]
        collection = path(desired["apiVersion"], PLURALS[kind], namespace)
        where = f"{kind} {namespace + '/' if namespace else ''}{name}"
        status, current = self.api.request(f"read {where}", "GET", f"{collection}/{name}", allow=(404,))
        if status == 404:
            status, current = self.api.request(
                f"create {where}", "POST", collection, body=desired, allow=(404, 409)
            )
            if status == 404:  # the resource type itself is unknown: Kueue's CRDs
                if kind == "WorkloadPriorityClass":
                    # a Kueue before WorkloadPriorityClass ignores the Jobs' priority-class label
                    logger.warning("cluster %s: Kueue serves no WorkloadPriorityClass", self.config.slug)
                    return "missing"
                raise BackendError(
                    f"create {where}: the API server does not serve {desired['apiVersion']} {kind}"
                )
            if status != 409:
                return "created"
            _status, current = self.api.request(f"read {where}", "GET", f"{collection}/{name}")
        if kind == "PersistentVolumeClaim":
            # its class and access modes are immutable and its size can only grow, where the class
            # allows it: an admin who changes the cluster's scratch settings resizes or replaces it
            return "unchanged"
        if (
            kind == "LocalQueue"
            and (current.get("spec") or {}).get("clusterQueue") != desired["spec"]["clusterQueue"]
        ):
            # immutable in Kueue: made again, into the other ClusterQueue (a tenant that joined or
            # left a cohort). Its workloads keep their queue name and find the new one.
            self.api.request(f"delete {where}", "DELETE", f"{collection}/{name}", allow=(404,))
            status, _body = self.api.request(
                f"create {where}", "POST", collection, body=desired, allow=(409,)
            )
            if status == 409:  # the old one is still going: the next apply makes it
                raise BackendUnavailable(f"create {where}: the previous LocalQueue is still being deleted")
            return "replaced"
        if (
            kind == "Namespace"
            and (current["metadata"].get("labels") or {}).get(MANAGED_BY_KEY) != MANAGED_BY
        ):
            raise BackendError(
                f"namespace {name} exists and is not the portal's: label it {MANAGED_BY_KEY}={MANAGED_BY} "
                "to hand it over, or rename the tenant"
            )
        if kind in ("PriorityClass", "WorkloadPriorityClass") and current.get("value") != desired["value"]:
            # immutable: keep the cluster's value, say so
            logger.warning(
                "cluster %s: %s %s has value %s, not %s",
                self.config.slug,
                kind,
                name,
                current.get("value"),
                desired["value"],
            )
            desired = {
                **desired,
                "value": current.get("value"),
                "preemptionPolicy": current.get("preemptionPolicy"),
            }
            desired = {key: value for key, value in desired.items() if value is not None}
        if kind in ("ResourceQuota", "LimitRange"):  # a grant that ended leaves a 0, not a gap
            desired = keep_revoked(desired, current)
        stale = not contains(current, desired)
        if kind == "ResourceQuota":  # its hard limits are ours alone: exactly these
            stale = stale or set((current.get("spec") or {}).get("hard") or {}) != set(
                desired["spec"]["hard"]
            )
        if not stale:
            return "unchanged"
        self.api.request(f"update {where}", "PUT", f"{collection}/{name}", body=overlay(current, desired))
        return "updated"

    def identities_check(self, users: list[str]) -> dict[str, str]:
        """No POSIX identities: a tenant's namespace is its identity (restricted, no token)."""
        return {}

    def health(self) -> Health:
        """GET /version, then one Jobs list (limit 1): the API server answers, and it accepts the
        portal's credentials and lets it list Jobs."""
        try:
            _status, version = self.api.request("read /version", "GET", "/version")
            self.api.request(
                "list Jobs",
                "GET",
                path("batch/v1", "jobs"),
                query={"limit": 1, "labelSelector": MANAGED_SELECTOR},
            )
        except BackendError as exc:  # BackendUnavailable included
            return Health(False, str(exc)[:300])
        except Exception as exc:  # health() never raises: it is what tells admins what broke
            return Health(False, f"{type(exc).__name__}")
        return Health(True, f"Kubernetes {version.get('gitVersion', '?')}"[:200])
