"""A job's output, read from its scheduler for the API and the job page."""

from django.conf import settings

from clusters.backends.base import BackendError, JobRef, LogTail
from clusters.breaker import breaker_state
from clusters.services import backend_of
from jobs.models import Job
from jobs.services.common import log
from portal.core.errors import Unavailable


def job_log_tail(*, job: Job, lines: int) -> LogTail:
    """The last lines of the job's output; a scheduler that cannot be read answers Unavailable."""
    if not job.backend_id:
        return LogTail(lines=[], truncated=False)
    ref = JobRef(backend_id=job.backend_id, token=job.token, account=job.tenant.slug, user=job.cluster_user)
    if breaker_state(cluster_id=job.cluster_id).cooling:  # a request must not wait on a cluster that hangs
        raise Unavailable(f"The log of job {job.pk} cannot be read from {job.cluster.slug} now.")
    try:
        return backend_of(job.cluster).log_tail(ref, lines=lines, max_bytes=settings.JOB_LOG_MAX_BYTES)
    except BackendError as exc:  # BackendUnavailable included
        log.warning("log of job %s unavailable: %s", job.pk, exc.__class__.__name__)
        raise Unavailable(f"The log of job {job.pk} cannot be read from {job.cluster.slug} now.") from None
