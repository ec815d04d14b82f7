"""Every write about jobs, one module per part of a job's flow; imported from here.

The modules stand on each other in one direction (docs/architecture.md, "jobs/services"):
common ← admission ← finish ← {submit, poll, cancel, dispatch} ← {idle, cleanup}; none imports
one above it, and tests/repository/test_structure.py holds the import graph to that."""

from jobs.services.admission import jobs_admit
from jobs.services.attempts import attempt_review
from jobs.services.cancel import job_cancel, job_cancel_in_scheduler, job_stop, job_warn
from jobs.services.cleanup import (
    GrantEndReport,
    OrphanReport,
    RetentionReport,
    ScratchReport,
    SuspendedReport,
    WalltimeCapReport,
    grants_end,
    jobs_cap_walltime,
    orphans_find,
    retention_apply,
    scratch_purge,
    scratch_purge_targets,
    tenants_hold_suspended,
)
from jobs.services.dispatch import job_claim, jobs_dispatch, jobs_sweep, spec_of
from jobs.services.finish import job_finish
from jobs.services.idle import IdleReport, jobs_watch_idle
from jobs.services.logs import job_log_tail
from jobs.services.poll import jobs_poll
from jobs.services.submit import IDEMPOTENCY_KEY_MAX, JobPreview, JobRequest, job_preview, job_submit
from jobs.services.telemetry import SampleReport, cluster_gpu_samples, jobs_sample_gpus

__all__ = [
    "IDEMPOTENCY_KEY_MAX",
    "GrantEndReport",
    "IdleReport",
    "JobPreview",
    "JobRequest",
    "OrphanReport",
    "RetentionReport",
    "SampleReport",
    "ScratchReport",
    "SuspendedReport",
    "WalltimeCapReport",
    "attempt_review",
    "cluster_gpu_samples",
    "grants_end",
    "job_cancel",
    "job_cancel_in_scheduler",
    "job_claim",
    "job_finish",
    "job_log_tail",
    "job_preview",
    "job_stop",
    "job_submit",
    "job_warn",
    "jobs_admit",
    "jobs_cap_walltime",
    "jobs_dispatch",
    "jobs_poll",
    "jobs_sample_gpus",
    "jobs_sweep",
    "jobs_watch_idle",
    "orphans_find",
    "retention_apply",
    "scratch_purge",
    "scratch_purge_targets",
    "spec_of",
    "tenants_hold_suspended",
]
