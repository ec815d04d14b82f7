"""Every write about jobs, one module per part of a job's flow; imported from here."""

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
from jobs.services.dispatch import _claim, _spec, job_dispatch, jobs_sweep
from jobs.services.follow import (
    job_apply_status,
    job_cancel,
    job_cancel_in_scheduler,
    job_finish,
    job_log_tail,
    jobs_poll,
)
from jobs.services.idle import IdleReport, jobs_watch_idle
from jobs.services.submit import JobPreview, JobRequest, job_preview, job_submit, jobs_admit, request_digest

__all__ = [
    "GrantEndReport",
    "IdleReport",
    "JobPreview",
    "JobRequest",
    "OrphanReport",
    "RetentionReport",
    "ScratchReport",
    "SuspendedReport",
    "WalltimeCapReport",
    "_claim",
    "_spec",
    "grants_end",
    "job_apply_status",
    "job_cancel",
    "job_cancel_in_scheduler",
    "job_dispatch",
    "job_finish",
    "job_log_tail",
    "job_preview",
    "job_submit",
    "jobs_admit",
    "jobs_cap_walltime",
    "jobs_poll",
    "jobs_sweep",
    "jobs_watch_idle",
    "orphans_find",
    "request_digest",
    "retention_apply",
    "scratch_purge",
    "scratch_purge_targets",
    "tenants_hold_suspended",
]
