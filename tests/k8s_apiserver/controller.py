"""The fake cluster's controllers: one thread ticking every ~50 ms under the store's lock.

Job controller, garbage collector, TTL-after-finished, quota status, a scheduler and a *test kubelet*. The kubelet
ignores the image: it runs the first container's command+args as a local subprocess (its own session, so a kill
reaches its children) in a per-pod temp dir with the container's env, stdout+stderr to the pod's log. Commands,
args and env values get Kubernetes' $(VAR) expansion, so "$$" becomes "$" as on a real node.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass

from .store import (
    BY_NAME,
    RESOURCES,
    TERMINAL,
    ApiError,
    Store,
    format_quantity,
    get_in,
    now_iso,
    parse_quantity,
    pod_usage,
)

log = logging.getLogger(__name__)
PODS, JOBS, EVENTS = BY_NAME["pods"], BY_NAME["jobs"], BY_NAME["events"]
INDEX = "batch.kubernetes.io/job-completion-index"
LOG_KEEP = 1 << 20  # a pod's log: its last 1 MiB
MAX_GRACE_S = 5.0  # deleting a running pod: SIGTERM, then SIGKILL after min(grace period, this)


@dataclass
class Proc:
    workdir: str
    popen: subprocess.Popen | None = None
    started: str = ""
    term_at: float | None = None

    @property
    def log_path(self) -> str:
        return os.path.join(self.workdir, "container.log")

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.running():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, sig)


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known names replaced, unknown ones kept, "$$" escapes a "$"."""
    return re.sub(r"\$(\$|\(([^)]*)\))", lambda m: "$" if m[1] == "$" else env.get(m[2], m[0]), text)


def condition(obj: dict, *types: str) -> dict | None:
    """The first of these condition types that is True."""
    true = [c for c in obj["status"].get("conditions") or [] if c["status"] == "True"]
    return next((c for c in true if c["type"] in types), None)


def _phase(pod: dict) -> str:
    return pod["status"]["phase"]


def _requests(pod: dict) -> Counter:
    return Counter({k[9:]: v for k, v in pod_usage(pod).items() if k.startswith("requests.")} | {"pods": 1})


class Cluster:
    def __init__(self, store: Store, tick_s: float = 0.05):
        self.store, self.tick_s = store, tick_s
        self.procs: dict[str, Proc] = {}  # pod uid → its process
        self.clock: dict[str, dict[str, float]] = {}  # job uid → monotonic "start" and "finish"
        self.counted: dict[str, dict[str, tuple[str, str | None]]] = {}  # job uid → pod uid → (phase, index)
        self.errors: list[str] = []  # the last exceptions a tick raised, for debugging
        self.root = tempfile.mkdtemp(prefix="fake-kubelet-")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-k8s-controllers", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        with self.store.lock:
            for uid in list(self.procs):
                self._forget(uid)
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            with self.store.lock:
                try:
                    self.tick()
                except Exception as exc:  # keep ticking
                    log.exception("fake k8s controller tick failed")
                    self.errors = [*self.errors[-9:], repr(exc)]

    def tick(self) -> None:
        jobs = {j["metadata"]["uid"] for j in self.store.list(JOBS, None)}
        for pod in self.store.list(PODS, None):  # garbage collector: the pods of deleted Jobs go
            if (owners := _owners(pod, "Job")) and not jobs & owners:
                self.delete_pod(pod)
        for uid in set(self.clock) - jobs:
            self.clock.pop(uid)
            self.counted.pop(uid, None)
        for job in self.store.list(JOBS, None):
            self._sync_job(job)
        for pod in self.store.list(PODS, None):
            self._kubelet(pod)
        for quota in self.store.list(BY_NAME["resourcequotas"], None):
            hard = get_in(quota, ("spec", "hard")) or {}
            used = self.store.quota_used(quota["metadata"]["namespace"])
            used = {k: format_quantity(used.get(k, 0), str(hard[k]).endswith("i")) for k in hard}
            self.store.update_status(quota, {"hard": dict(hard), "used": used})

    # ------------------------------------------------------------------ deletion --
    def delete(self, res, ns: str, name: str, policy: str | None = None, grace: int | None = None) -> dict:
        """DELETE as the API server answers it."""
        obj = self.store.get(res, ns, name)
        meta = obj["metadata"]
        if res.plural == "pods":
            return self.delete_pod(obj, grace)
        if res.plural == "namespaces":  # simplified: its content goes at once, running pods get killed
            for r in RESOURCES:
                for o in self.store.list(r, name) if r.namespaced and r != PODS else ():
                    self.store.remove(r, name, o["metadata"]["name"])
            for pod in self.store.list(PODS, name):
                self.delete_pod(pod, 0)
            self.store.remove(res, "", name)
            return obj | {"status": {"phase": "Terminating"}}
        policy = policy or ("Orphan" if res.plural == "jobs" else "Background")  # batch/v1 orphans by default
        if policy == "Foreground":  # the job controller deletes the pods, then the Job
            if not meta.get("deletionTimestamp"):
                meta |= {"deletionTimestamp": now_iso(), "deletionGracePeriodSeconds": 0}
                meta |= {"finalizers": [*meta.get("finalizers", []), "foregroundDeletion"]}
                meta["resourceVersion"] = self.store.next_rv()
            return obj
        for pod in self._owned_pods(obj) if policy == "Orphan" else ():
            refs = pod["metadata"]["ownerReferences"]
            pod["metadata"]["ownerReferences"] = [r for r in refs if r["uid"] != meta["uid"]]
            pod["metadata"]["resourceVersion"] = self.store.next_rv()
        self.store.remove(res, ns, name)  # Background: the garbage collector takes the pods on its next tick
        if res.plural in ("services", "resourcequotas"):  # their stores answer with the deleted object
            return obj
        gone = {"name": name, "group": res.group, "kind": res.plural, "uid": meta["uid"]}
        gone = {k: v for k, v in gone.items() if v}
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": gone}

    def delete_pod(self, pod: dict, grace: int | None = None) -> dict:
        meta = pod["metadata"]
        proc = self.procs.get(meta["uid"])
        if proc is None or not proc.running():  # unscheduled or finished: gone at once
            self.store.remove(PODS, meta["namespace"], meta["name"])
            self._forget(meta["uid"])
        elif not meta.get("deletionTimestamp"):  # the kubelet stops it, then removes it
            grace = pod["spec"]["terminationGracePeriodSeconds"] if grace is None else grace
            meta |= {"deletionTimestamp": now_iso(), "deletionGracePeriodSeconds": grace}
            meta["resourceVersion"] = self.store.next_rv()
        return pod

    def _forget(self, pod_uid: str) -> None:
        proc = self.procs.pop(pod_uid, None)
        if proc is not None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired, AttributeError):
                proc.popen.wait(timeout=5)
            shutil.rmtree(proc.workdir, ignore_errors=True)

    def _owned_pods(self, owner: dict) -> list[dict]:
        uid, ns = owner["metadata"]["uid"], owner["metadata"].get("namespace")
        return [p for p in self.store.list(PODS, ns) if uid in _owners(p)]

    def event(self, obj: dict, kind: str, reason: str, message: str, component: str) -> None:
        """A core/v1 Event about obj; the same reason again bumps count, as event aggregation does."""
        meta, ts = obj["metadata"], now_iso()
        for ev in self.store.list(EVENTS, meta["namespace"]):
            if ev["involvedObject"]["uid"] == meta["uid"] and ev["reason"] == reason:
                ev |= {"count": ev["count"] + 1, "lastTimestamp": ts, "message": message}
                ev["metadata"]["resourceVersion"] = self.store.next_rv()
                return
        involved = {k: meta[k] for k in ("namespace", "name", "uid", "resourceVersion")}
        if ("", meta["namespace"]) not in self.store.data["namespaces"]:
            return  # the namespace went meanwhile
        self.store.create(
            EVENTS,
            meta["namespace"],
            {
                "metadata": {"name": f"{meta['name']}.{time.time_ns():x}"},
                "type": kind,
                "reason": reason,
                "message": message,
                "count": 1,
                "firstTimestamp": ts,
                "lastTimestamp": ts,
                "involvedObject": involved | {"kind": obj["kind"], "apiVersion": obj["apiVersion"]},
                "source": {"component": component},
                "reportingComponent": component,
            },
        )

    # -------------------------------------------------------------- job controller --
    def _sync_job(self, job: dict) -> None:
        meta, spec = job["metadata"], job["spec"]
        pods = self._owned_pods(job)
        if meta.get("deletionTimestamp"):  # foreground deletion
            for pod in pods:
                self.delete_pod(pod)
            if not pods:
                self.store.remove(JOBS, meta["namespace"], meta["name"])
            return
        counted, clock = self.counted.setdefault(meta["uid"], {}), self.clock.setdefault(meta["uid"], {})
        for pod in pods:
            if _phase(pod) in TERMINAL:
                counted[pod["metadata"]["uid"]] = (_phase(pod), pod["metadata"].get("labels", {}).get(INDEX))
        active = [p for p in pods if _phase(p) not in TERMINAL and not p["metadata"].get("deletionTimestamp")]
        indexed, completions = spec["completionMode"] == "Indexed", spec.get("completions")
        done_idx = sorted({int(i) for ph, i in counted.values() if ph == "Succeeded" and i is not None})
        n_ok = len(done_idx) if indexed else sum(ph == "Succeeded" for ph, _ in counted.values())
        n_failed = sum(ph == "Failed" for ph, _ in counted.values())
        status = copy.deepcopy(job["status"])
        conditions = status.setdefault("conditions", [])

        def finish(kind: str, reason: str, message: str) -> None:  # with 1.31's interim condition first
            ts, interim = now_iso(), "SuccessCriteriaMet" if kind == "Complete" else "FailureTarget"
            true = {"status": "True", "reason": reason, "message": message, "lastProbeTime": ts}
            conditions.extend(true | {"type": t, "lastTransitionTime": ts} for t in (interim, kind))
            if kind == "Complete":
                status["completionTime"] = ts
            clock["finish"] = time.monotonic()
            for pod in active:
                self.delete_pod(pod)
            if kind == "Complete":
                self.event(job, "Normal", "Completed", "Job completed", "job-controller")
            else:
                self.event(job, "Warning", reason, message, "job-controller")

        if condition(job, "Complete", "Failed"):
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None and time.monotonic() - clock.setdefault("finish", time.monotonic()) >= ttl:
                self.delete(JOBS, meta["namespace"], meta["name"], "Foreground")  # as the TTL controller does
        elif not spec.get("suspend"):
            if "start" not in clock:
                clock["start"], status["startTime"] = time.monotonic(), now_iso()
            deadline = spec.get("activeDeadlineSeconds")
            if n_failed > spec["backoffLimit"]:
                finish("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
            elif deadline is not None and time.monotonic() - clock["start"] >= deadline:
                finish("Failed", "DeadlineExceeded", "Job was active longer than specified deadline")
            elif n_ok >= completions if completions is not None else n_ok and not active:
                finish("Complete", "CompletionsReached", "Reached expected number of succeeded pods")
            else:
                self._create_pods(job, active, done_idx, n_ok)
        active = [p for p in self._owned_pods(job) if not p["metadata"].get("deletionTimestamp")]
        active = [p for p in active if _phase(p) not in TERMINAL]
        counts = {"active": len(active), "succeeded": n_ok, "failed": n_failed}
        status = {k: v for k, v in status.items() if v and k not in counts}
        status |= {k: v for k, v in counts.items() if v}  # zero counts are left out, as the real API does
        status["ready"] = sum(_phase(p) == "Running" for p in active)
        status |= {"completedIndexes": _intervals(done_idx)} if done_idx else {}
        self.store.update_status(job, status)

    def _create_pods(self, job: dict, active: list[dict], done_idx: list[int], n_ok: int) -> None:
        spec = job["spec"]
        room = spec["parallelism"] - len(active)
        if spec["completionMode"] == "Indexed":
            running = {p["metadata"]["labels"].get(INDEX) for p in active}
            todo = [i for i in range(spec["completions"]) if i not in done_idx and str(i) not in running]
            indexes = todo[: max(room, 0)]
        else:
            if spec.get("completions") is not None:
                room = min(room, spec["completions"] - n_ok - len(active))
            indexes = [None] * max(room, 0)
        for index in indexes:
            try:
                pod = self.store.create(PODS, job["metadata"]["namespace"], self._pod_for(job, index))
            except ApiError as exc:  # e.g. 403 exceeded quota: retried on a later tick
                self.event(job, "Warning", "FailedCreate", f"Error creating: {exc.message}", "job-controller")
                return
            created = f"Created pod: {pod['metadata']['name']}"
            self.event(job, "Normal", "SuccessfulCreate", created, "job-controller")

    @staticmethod
    def _pod_for(job: dict, index: int | None) -> dict:
        meta, template = job["metadata"], copy.deepcopy(job["spec"]["template"])
        pmeta, pspec = template.setdefault("metadata", {}), template.setdefault("spec", {})
        pmeta["generateName"] = f"{meta['name']}-" if index is None else f"{meta['name']}-{index}-"
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"]}
        pmeta["ownerReferences"] = [owner | {"controller": True, "blockOwnerDeletion": True}]
        if index is not None:
            pmeta.setdefault("labels", {})[INDEX] = pmeta.setdefault("annotations", {})[INDEX] = str(index)
            pspec["hostname"] = f"{meta['name']}-{index}"  # the template's subdomain stays
            ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX}']"}}
            for c in pspec.get("containers", []):
                c.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "valueFrom": ref})
        return {"metadata": pmeta, "spec": pspec}

    # ------------------------------------------------------- scheduler and kubelet --
    def _kubelet(self, pod: dict) -> None:
        proc = self.procs.get(pod["metadata"]["uid"])
        if pod["metadata"].get("deletionTimestamp"):
            if proc is not None and proc.running():
                grace = min(float(pod["metadata"]["deletionGracePeriodSeconds"]), MAX_GRACE_S)
                if proc.term_at is None:
                    proc.term_at = time.monotonic()
                    proc.kill(signal.SIGTERM if grace > 0 else signal.SIGKILL)
                elif time.monotonic() - proc.term_at >= grace:
                    proc.kill()
            else:
                self.store.remove(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
                self._forget(pod["metadata"]["uid"])
        elif _phase(pod) == "Pending" and not pod["spec"].get("nodeName"):
            self._schedule(pod)
        elif _phase(pod) == "Pending" and proc is None:
            self._start(pod)
        elif _phase(pod) == "Running" and proc is not None and not proc.running():
            self._finish(pod, proc)

    def _unfit(self, pod: dict, node: dict) -> str | None:
        """Why the node cannot take the pod, worded as the scheduler words it; None if it can."""
        labels, spec = node["metadata"].get("labels") or {}, pod["spec"]
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return "node(s) didn't match Pod's node affinity/selector"
        for taint in node["spec"].get("taints") or []:
            tolerated = any(_tolerates(tol, taint) for tol in spec.get("tolerations") or [])
            if taint.get("effect") != "PreferNoSchedule" and not tolerated:
                return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
        used, alloc = Counter(), node["status"]["allocatable"]
        for other in self.store.list(PODS, None):
            if other["spec"].get("nodeName") == node["metadata"]["name"] and _phase(other) not in TERMINAL:
                used += _requests(other)
        for name, quantity in sorted(_requests(pod).items()):
            if (name in alloc or "/" in name) and used[name] + quantity > parse_quantity(alloc.get(name, 0)):
                return f"Insufficient {name}"
        return None

    def _schedule(self, pod: dict) -> None:
        """The first node whose labels match the nodeSelector, whose taints are tolerated, with room; none
        while a PersistentVolumeClaim of the pod does not exist (the scheduler's VolumeBinding)."""
        nodes, reasons = self.store.list(BY_NAME["nodes"], None), Counter()
        for claim in _claims(pod):
            if (pod["metadata"]["namespace"], claim) not in self.store.data["persistentvolumeclaims"]:
                return self._unschedulable(
                    pod, f'0/{len(nodes)} nodes are available: persistentvolumeclaim "{claim}" not found.'
                )
        for node in nodes:
            if not (why := self._unfit(pod, node)):
                pod["spec"]["nodeName"] = node["metadata"]["name"]
                scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_iso()}
                return self.store.update_status(pod, pod["status"] | {"conditions": [scheduled]})
            reasons[why] += 1
        message = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
        self._unschedulable(pod, f"0/{len(nodes)} nodes are available: {message}.")

    def _unschedulable(self, pod: dict, message: str) -> None:
        if not any(c.get("message") == message for c in pod["status"].get("conditions") or []):
            unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
            unschedulable |= {"message": message, "lastTransitionTime": now_iso()}
            self.store.update_status(pod, pod["status"] | {"conditions": [unschedulable]})
            self.event(pod, "Warning", "FailedScheduling", message, "default-scheduler")

    def _start(self, pod: dict) -> None:
        meta, container = pod["metadata"], (pod["spec"].get("containers") or [{}])[0]
        proc = self.procs[meta["uid"]] = Proc(tempfile.mkdtemp(prefix=f"{meta['name']}-", dir=self.root))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": proc.workdir}
        env["HOSTNAME"] = pod["spec"].get("hostname") or meta["name"]
        claims = self._claim_dirs(pod, container)
        for item in container.get("env") or []:  # value (with $(VAR)s) or valueFrom.fieldRef
            if path := get_in(item, ("valueFrom", "fieldRef", "fieldPath")):
                m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
                value = (meta.get(m[1]) or {}).get(m[2]) if m else get_in(pod, path.split("."))
                env[item["name"]] = "" if value is None else str(value)
            else:
                env[item["name"]] = _in_claims(expand(str(item.get("value", "")), env), claims)
        argv = [expand(str(a), env) for a in (container.get("command") or []) + (container.get("args") or [])]
        proc.started = now_iso()
        try:
            if not argv:
                raise OSError("test kubelet: the container has no command (images are not run)")
            with open(proc.log_path, "ab") as out:
                proc.popen = subprocess.Popen(
                    argv,
                    cwd=proc.workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except (OSError, ValueError) as exc:
            state = {"exitCode": 128, "reason": "StartError", "message": str(exc), "startedAt": proc.started}
            state |= {"finishedAt": now_iso()}
            status = {"phase": "Failed", "containerStatuses": [_cstatus(container, {"terminated": state})]}
            return self.store.update_status(pod, pod["status"] | status)
        ready = [
            {"type": t, "status": "True", "lastTransitionTime": proc.started}
            for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
        ]
        status = {"phase": "Running", "startTime": proc.started, "hostIP": "127.0.0.1", "podIP": "127.0.0.1"}
        status |= {
            "conditions": ready,
            "containerStatuses": [_cstatus(container, {"running": {"startedAt": proc.started}})],
        }
        self.store.update_status(pod, pod["status"] | status)

    def _claim_dirs(self, pod: dict, container: dict) -> dict[str, str]:
        """mountPath → this machine's directory of the claim mounted there (one per claim, made on first
        use, kept for the server's life): the test kubelet has no mount namespace to mount it in."""
        volumes = pod["spec"].get("volumes") or []
        claims = {v["name"]: c for v in volumes if (c := get_in(v, ("persistentVolumeClaim", "claimName")))}
        found = {}
        for mount in container.get("volumeMounts") or []:
            if claim := claims.get(mount.get("name")):
                host = os.path.join(self.root, "claims", pod["metadata"]["namespace"], claim)
                os.makedirs(host, exist_ok=True)
                found[mount["mountPath"].rstrip("/")] = host
        return found

    def _finish(self, pod: dict, proc: Proc) -> None:
        code = proc.popen.returncode
        code = 128 - code if code < 0 else code  # killed by signal N: 128+N, as container runtimes report
        with contextlib.suppress(
            ProcessLookupError, PermissionError
        ):  # PID 1 is gone: so is all it left behind
            os.killpg(proc.popen.pid, signal.SIGKILL)
        oom = code == 137 and (pod["metadata"].get("annotations") or {}).get("test.gpu-portal/oom") == "true"
        reason = "Completed" if code == 0 else "OOMKilled" if oom else "Error"
        with contextlib.suppress(OSError), open(proc.log_path, "rb+") as f:  # keep the last 1 MiB
            if (size := f.seek(0, os.SEEK_END)) > LOG_KEEP:
                f.seek(size - LOG_KEEP)
                tail = f.read()
                f.seek(0)
                f.write(tail)
                f.truncate()
        state = {"exitCode": code, "reason": reason, "startedAt": proc.started, "finishedAt": now_iso()}
        not_ready = {"status": "False", "reason": "PodCompleted"}
        conditions = [
            c | not_ready if c["type"] in ("Ready", "ContainersReady") else c
            for c in pod["status"]["conditions"]
        ]
        status = {"phase": "Succeeded" if code == 0 else "Failed", "conditions": conditions}
        status["containerStatuses"] = [_cstatus(pod["spec"]["containers"][0], {"terminated": state})]
        self.store.update_status(pod, pod["status"] | status)

    def read_log(self, pod: dict) -> bytes:
        proc = self.procs.get(pod["metadata"]["uid"])
        with contextlib.suppress(OSError, AttributeError), open(proc.log_path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_KEEP))
            return f.read()
        return b""


def _in_claims(value: str, claims: dict[str, str]) -> str:
    """An env value that names a path under a claim's mountPath, as the path of the claim's directory."""
    for mount_path, host in claims.items():
        if value == mount_path or value.startswith(f"{mount_path}/"):
            return host + value[len(mount_path) :]
    return value


def _claims(pod: dict) -> list[str]:
    return [
        c
        for v in pod["spec"].get("volumes") or []
        if (c := get_in(v, ("persistentVolumeClaim", "claimName")))
    ]


def _owners(obj: dict, kind: str = "") -> set[str]:
    return {
        r["uid"] for r in obj["metadata"].get("ownerReferences") or [] if r.get("kind") == kind or not kind
    }


def _intervals(indexes: list[int]) -> str:
    """Sorted indexes as the Job API writes them: "0,1", "0-2", "0-2,5"."""
    runs: list[list[int]] = []
    for i in indexes:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a},{b}" if b == a + 1 else f"{a}-{b}" for a, b in runs)


def _cstatus(container: dict, state: dict) -> dict:
    running = "running" in state
    return {
        "name": container.get("name", ""),
        "image": container.get("image", ""),
        "imageID": "",
        "containerID": "",
        "ready": running,
        "started": running,
        "restartCount": 0,
        "state": state,
    }


def _tolerates(tol: dict, taint: dict) -> bool:
    if tol.get("effect") and tol["effect"] != taint.get("effect"):
        return False
    if tol.get("operator") == "Exists":
        return not tol.get("key") or tol["key"] == taint["key"]
    return tol.get("key") == taint["key"] and tol.get("value", "") == taint.get("value", "")
