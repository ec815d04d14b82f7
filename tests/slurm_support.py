"""What the tests against the real Slurm testbed (tests/testbed/testbed.sh) share: a job spec for it,
the wait for a job's end, the removal of what a job left, of an account, and a tenant of the portal's
own on the registered testbed. tests/testbed/env.py brings the testbed up and says how to reach it."""

import shutil
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from clusters.backends import base
from clusters.backends.base import JobSpec
from clusters.backends.slurm import SlurmBackend
from clusters.models import Cluster
from clusters.services import cluster_config
from jobs.services import JobRequest
from tenants.limits import tenant_apply
from tenants.models import Role, Tenant
from tests.conftest import join
from tests.factories import QuotaGrantFactory, catalog_pair
from tests.jobs_support import submit_admitted
from tests.testbed.env import testbed_env, testbed_identity
from tests.wait_support import wait_until

POLL_S = 0.5
JOB_TIMEOUT_S = 60
SCRIPT = "#!/bin/sh\ntrue\n"  # over at once: the fault tests hold the shared testbed's GPUs briefly
GPU_MODEL = "a100-80gb"  # the a100 partition: the end-to-end tests use h100


def job_spec(script: str, **overrides) -> JobSpec:
    """A job of 1 h100 GPU for 2 minutes under the testbed's first account, run as its identity."""
    values = {
        "token": uuid.uuid4().hex,
        "name": "portal-test",
        "account": testbed_env()["SLURM_TESTBED_ACCOUNT"],
        "user": testbed_env()["SLURM_TESTBED_IDENTITY"],
        "qos": "normal",
        "priority": "normal",
        "partition": "h100",
        "gpu_type": "h100",
        "k8s_resource": "nvidia.com/gpu",
        "k8s_product": "",
        "gpus_per_node": 1,
        "nodes": 1,
        "walltime_minutes": 2,
        "script": "#!/bin/bash\nset -eu\n" + script.strip() + "\n",
        "env": {},
        "cpus_per_gpu": 1,
        "mem_per_gpu_mb": 100,
    }
    values.update(overrides)
    return JobSpec(**values)


def remove_local(path: str) -> None:
    """An identity's file or tree, removed as root (the service user may not, by design)."""
    target = Path(path)
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target, ignore_errors=True)
    else:
        target.unlink(missing_ok=True)


def status_of(backend: SlurmBackend, job_id: str) -> base.JobStatus | None:
    return backend.poll([job_id]).get(job_id)


def wait_for_end(backend: SlurmBackend, job_id: str, timeout: float = JOB_TIMEOUT_S) -> base.JobStatus:
    def ended():
        status = status_of(backend, job_id)
        return status if status is not None and status.state in base.END_STATES else None

    return wait_until(ended, timeout_s=timeout, interval_s=POLL_S, what=f"job {job_id} to end")


def delete_account(backend: SlurmBackend, account: str) -> None:
    """Cancel the account's jobs, wait until slurmctld lets go of them, delete the account."""
    backend.run(["scancel", "--account", account])
    wait_until(
        lambda: not backend.check(["squeue", "-h", "-A", account, "-o", "%i"]).strip(),
        timeout_s=30,
        interval_s=POLL_S,
        what=f"jobs of {account} to leave the queue",
    )
    wait_until(
        lambda: backend.run(["sacctmgr", "-i", "delete", "account", f"name={account}"]).rc == 0,
        timeout_s=30,
        interval_s=POLL_S,
        what=f"account {account} to be deleted",
    )
    assert not backend.check(["sacctmgr", "-n", "-P", "show", "account", account, "format=account"]).strip()


@dataclass
class SlurmTenant:
    cluster: Cluster
    tenant: Tenant
    user: object
    request: JobRequest
    backend: SlurmBackend = field(init=False)

    def __post_init__(self) -> None:
        self.backend = SlurmBackend(cluster_config(self.cluster))

    def submit(self, count: int = 1) -> list[int]:
        """Jobs through job_submit, each committed on its own and then admitted as the admit task
        would: dispatch is enqueued on the admission's commit."""
        return [submit_admitted(self.user, self.request).pk for _ in range(count)]

    def slurm_jobs(self) -> dict[str, set[str]]:
        """Slurm job ids per token under the tenant's account: squeue -t all (jobs of the last
        MinJobAge, 300 s) and sacct (the SubmitLine holds --comment=<token>), joined by id."""
        account = self.tenant.slug
        found: dict[str, set[str]] = defaultdict(set)
        live = self.backend.check(["squeue", "-h", "-t", "all", "-A", account, "-o", "%i|%k"])
        for line in live.split():
            job_id, _, token = line.partition("|")
            found[token].add(job_id)
        argv = ["sacct", "-X", "-P", "-n", "-A", account, "-S", "now-1days", "-o", "JobID,SubmitLine"]
        for line in self.backend.check(argv).splitlines():
            job_id, _, submit_line = line.partition("|")
            for word in submit_line.split():
                if word.startswith("--comment="):
                    found[word.removeprefix("--comment=")].add(job_id)
        return found

    def cleanup(self) -> None:
        """Cancel what is left and drop the account (Slurm accounts outlive the test database)."""
        self.backend.run(["scancel", "-A", self.tenant.slug])
        self.backend.run(["sacctmgr", "-i", "delete", "account", self.tenant.slug])


def slurm_tenant(cluster: Cluster, *, gpus: int = 8) -> SlurmTenant:
    """A tenant of its own (unique slug) with a grant of `gpus` concurrent a100 GPUs, applied."""
    scenario, gpu_model = catalog_pair("ai-training", GPU_MODEL)
    tenant = Tenant.objects.create(slug=f"fault-{uuid.uuid4().hex[:8]}", name="Faults")
    testbed_identity(f"pt-{tenant.slug}")  # its job identity on the testbed (the cluster's template)
    user = join(tenant, f"{tenant.slug}-member", Role.MEMBER)
    QuotaGrantFactory(tenant=tenant, pair=(scenario, gpu_model), gpus=gpus, gpu_hours=1000, days=1)
    tenant_apply(tenant_id=tenant.pk, cluster_id=cluster.pk)
    request = JobRequest(
        tenant=tenant, scenario=scenario, gpu_model=gpu_model, gpus=1, walltime_minutes=1, name="fault",
        script=SCRIPT, cluster=cluster, partition="a100",
    )  # fmt: skip
    return SlurmTenant(cluster=cluster, tenant=tenant, user=user, request=request)
