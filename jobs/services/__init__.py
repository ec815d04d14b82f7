"""Every write about jobs, one module per part of a job's flow; imported from here."""

from jobs.services.dispatch import _claim, _spec, job_dispatch, jobs_sweep
from jobs.services.follow import (
    job_apply_status,
    job_cancel,
    job_cancel_in_scheduler,
    job_finish,
    job_log_tail,
    jobs_poll,
)
from jobs.services.limits import tenant_apply, tenant_limits
from jobs.services.submit import JobPreview, JobRequest, job_preview, job_submit, jobs_admit, request_digest

__all__ = [
    "JobPreview",
    "JobRequest",
    "_claim",
    "_spec",
    "job_apply_status",
    "job_cancel",
    "job_cancel_in_scheduler",
    "job_dispatch",
    "job_finish",
    "job_log_tail",
    "job_preview",
    "job_submit",
    "jobs_admit",
    "jobs_poll",
    "jobs_sweep",
    "request_digest",
    "tenant_apply",
    "tenant_limits",
]
