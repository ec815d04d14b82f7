"""From a Job, its pods and its events (plain dicts, as the API returns them) to the portal's state.

The order of the checks is the order of precedence:

    Job condition Complete                       COMPLETED (exit 0)
    Job condition Failed, reason DeadlineExceeded TIMEOUT (activeDeadlineSeconds = the walltime)
    Job condition Failed, any other reason       by the pods that failed, worst first:
        pod condition DisruptionTarget by DeletionByTaintManager/DeletionByPodGC,
        or pod reason NodeLost/NodeAffinity/NodeShutdown          NODE_FAIL
        DisruptionTarget (PreemptionByScheduler, EvictionByEvictionAPI, TerminationByKubelet),
        or pod reason Evicted/Preempting/PreemptionByScheduler    PREEMPTED
        a container terminated OOMKilled                         OUT_OF_MEMORY
        otherwise                                                FAILED, with the exit code
    metadata.deletionTimestamp (cancel deletes the Job)          CANCELLED
    spec.suspend (Kueue has not admitted it, or took it back)    PENDING, reason Suspended
    a pod running (or status.ready > 0)                          RUNNING
    pods pending                                                 PENDING, the pod's reason
    no pod, a FailedCreate event "exceeded quota"                PENDING, reason ExceededQuota

raw_state keeps Kubernetes' word (Complete, BackoffLimitExceeded, DeadlineExceeded…) and reason
the pod's (OOMKilled, PreemptionByScheduler, NodeLost, Unschedulable, ImagePullBackOff…).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from clusters.backends import base
from clusters.backends.base import JobStatus
from clusters.backends.kubernetes.common import backend_id
from clusters.backends.kubernetes.manifests import CONTAINER

NODE_FAIL_DISRUPTIONS = frozenset({"DeletionByTaintManager", "DeletionByPodGC"})
NODE_FAIL_REASONS = frozenset({"NodeLost", "NodeAffinity", "NodeShutdown"})
PREEMPTED_REASONS = frozenset({"Evicted", "Preempting", "PreemptionByScheduler", "PreemptionByKubeScheduler"})
QUOTA_REASON = "ExceededQuota"
_SEVERITY = {
    base.JobState.NODE_FAIL: 4,
    base.JobState.PREEMPTED: 3,
    base.JobState.TIMEOUT: 2,
    base.JobState.OUT_OF_MEMORY: 1,
    base.JobState.FAILED: 0,
}


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _conditions(obj: dict) -> dict[str, dict]:
    """The conditions whose status is True, by type."""
    return {
        c.get("type", ""): c
        for c in (obj.get("status") or {}).get("conditions") or []
        if str(c.get("status")) == "True"
    }


def _containers(pod: dict) -> list[dict]:
    """The pod's container statuses, the job's own container first."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sorted(statuses, key=lambda s: s.get("name") != CONTAINER)


def _phase(pod: dict) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def finished_at(job: dict) -> datetime | None:
    """When the Job ended (its Complete or Failed condition), None while it has not; a Job being
    deleted has not ended by its own conditions."""
    conditions = _conditions(job)
    if complete := conditions.get("Complete"):
        status = job.get("status") or {}
        return parse_time(status.get("completionTime") or complete.get("lastTransitionTime"))
    if failed := conditions.get("Failed"):
        return parse_time(failed.get("lastTransitionTime"))
    return None


def ending(job: dict) -> bool:
    """Whether the Job has ended or its controller has decided that it will (the interim
    SuccessCriteriaMet and FailureTarget conditions of Kubernetes 1.31 on): its pods' end is
    their own, whatever happens to them now."""
    return bool({"Complete", "Failed", "SuccessCriteriaMet", "FailureTarget"} & set(_conditions(job)))


def needs_pods(job: dict) -> bool:
    """Whether the Job's pods can tell more than the Job: not for a Job that completed or waits
    suspended."""
    return "Complete" not in _conditions(job) and not (job.get("spec") or {}).get("suspend")


def needs_events(job: dict, pods: list[dict]) -> bool:
    """A Job that should have pods and has none: its events say why (FailedCreate)."""
    status = job.get("status") or {}
    if (
        pods
        or _conditions(job)
        or (job.get("spec") or {}).get("suspend")
        or job["metadata"].get("deletionTimestamp")
    ):
        return False
    return not any(status.get(key) for key in ("active", "ready", "succeeded", "failed"))


def pod_failure(pod: dict) -> tuple[str, str, int | None]:
    """(portal state, reason, exit code) of one pod that ended badly, or (FAILED, '', None)."""
    status = pod.get("status") or {}
    reason = status.get("reason") or ""
    disruption = _conditions(pod).get("DisruptionTarget")
    code, container_reason = None, ""
    for container in _containers(pod):
        terminated = (container.get("state") or {}).get("terminated") or (
            (container.get("lastState") or {}).get("terminated") or {}
        )
        if terminated and terminated.get("exitCode") not in (None, 0) and code is None:
            code, container_reason = terminated.get("exitCode"), terminated.get("reason") or ""
        if terminated.get("reason") == "OOMKilled":
            code, container_reason = terminated.get("exitCode", 137), "OOMKilled"
            break
    if disruption is not None:
        why = disruption.get("reason") or "DisruptionTarget"
        state = base.JobState.NODE_FAIL if why in NODE_FAIL_DISRUPTIONS else base.JobState.PREEMPTED
        return state, why, code
    if reason in NODE_FAIL_REASONS:
        return base.JobState.NODE_FAIL, reason, code
    if reason in PREEMPTED_REASONS:
        return base.JobState.PREEMPTED, reason, code
    if reason == "DeadlineExceeded":
        return base.JobState.TIMEOUT, reason, code
    if container_reason == "OOMKilled":
        return base.JobState.OUT_OF_MEMORY, "OOMKilled", code
    return base.JobState.FAILED, container_reason or reason, code


def _worst_failure(pods: list[dict]) -> tuple[str, str, int | None]:
    failures = [
        pod_failure(pod)
        for pod in pods
        if _phase(pod) == "Failed" or _conditions(pod).get("DisruptionTarget")
    ]
    failures = failures or [pod_failure(pod) for pod in pods]
    if not failures:
        return base.JobState.FAILED, "", None
    return max(failures, key=lambda f: (_SEVERITY[f[0]], f[2] is not None))


def _started(job: dict, pods: list[dict]) -> datetime | None:
    times = []
    for pod in pods:
        for container in _containers(pod):
            state = container.get("state") or {}
            for key in ("running", "terminated"):
                if when := parse_time((state.get(key) or {}).get("startedAt")):
                    times.append(when)
    if times or pods:
        return min(times, default=None)
    return parse_time((job.get("status") or {}).get("startTime"))  # pods not asked for, or gone


def _pending_reason(pods: list[dict]) -> str:
    for pod in pods:
        for container in _containers(pod):
            reason = ((container.get("state") or {}).get("waiting") or {}).get("reason")
            if reason and reason != "ContainerCreating":
                return reason
        scheduled = next(
            (c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"),
            None,
        )
        if scheduled is not None and str(scheduled.get("status")) == "False":
            return scheduled.get("reason") or "Unschedulable"
    return "ContainerCreating" if pods else ""


def _create_failure(events: Iterable[dict]) -> tuple[str, str] | None:
    """(raw state, reason) from the Job's latest FailedCreate event."""

    def when(event: dict) -> str:
        return (
            event.get("lastTimestamp")
            or event.get("eventTime")
            or event["metadata"].get("creationTimestamp")
            or ""
        )

    failed = sorted((e for e in events if e.get("reason") == "FailedCreate"), key=when)
    if not failed:
        return None
    message = failed[-1].get("message") or ""
    if "exceeded quota" in message:
        return "FailedCreate", QUOTA_REASON
    return "FailedCreate", " ".join(message.split())[:200] or "FailedCreate"


def job_status(job: dict, pods: list[dict] | None = None, events: list[dict] | None = None) -> JobStatus:
    """The JobStatus of one Job, from the Job, its pods and the Job's events."""
    pods, meta, status = pods or [], job["metadata"], job.get("status") or {}
    bid = backend_id(meta.get("namespace", ""), meta["name"])
    conditions = _conditions(job)
    node_list = ",".join(sorted({n for p in pods if (n := (p.get("spec") or {}).get("nodeName"))}))
    started = _started(job, pods)

    def ended(state: str, raw: str, reason: str, code: int | None, finished: str | None) -> JobStatus:
        return JobStatus(bid, state, raw, reason, code, started, parse_time(finished), node_list)

    if complete := conditions.get("Complete"):
        return ended(
            base.JobState.COMPLETED,
            "Complete",
            "",
            0,
            status.get("completionTime") or complete.get("lastTransitionTime"),
        )
    if failed := conditions.get("Failed"):
        raw = failed.get("reason") or "Failed"
        finished = failed.get("lastTransitionTime")
        if raw == "DeadlineExceeded":
            return ended(base.JobState.TIMEOUT, raw, raw, None, finished)
        state, reason, code = _worst_failure(pods)
        return ended(state, raw, reason or raw, code, finished)
    if meta.get("deletionTimestamp"):
        return ended(
            base.JobState.CANCELLED, "Deleting", "deleted by cancel", None, meta["deletionTimestamp"]
        )
    if (job.get("spec") or {}).get("suspend"):
        suspended = conditions.get("Suspended", {})
        reason = suspended.get("reason") or "Suspended"
        return JobStatus(bid, base.JobState.PENDING, "Suspended", reason, node_list=node_list)
    if any(_phase(p) == "Running" for p in pods) or (not pods and status.get("ready")):
        return JobStatus(bid, base.JobState.RUNNING, "Running", "", started_at=started, node_list=node_list)
    if not pods and (created := _create_failure(events or [])):
        return JobStatus(bid, base.JobState.PENDING, created[0], created[1])
    if any(_phase(p) in ("Succeeded", "Failed") for p in pods):
        # some pods ended, the Job has no verdict yet (other indexes, or FailureTarget set)
        return JobStatus(bid, base.JobState.RUNNING, "Running", "", started_at=started, node_list=node_list)
    return JobStatus(bid, base.JobState.PENDING, "Pending", _pending_reason(pods), node_list=node_list)
