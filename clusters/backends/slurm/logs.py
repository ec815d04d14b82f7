"""Job logs (<scratch root>/<identity>/<account>/<token>.out): their tail, read as the job's
identity (or over SFTP for a job from before identities), and their deletion after retention."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from clusters.backends import base
from clusters.backends.base import JobRef, LogTail
from clusters.backends.slurm import scratch, ssh
from clusters.backends.slurm.parse import check_count, check_name, check_token

if TYPE_CHECKING:
    from clusters.backends.slurm.backend import SlurmBackend

LOG_ACCOUNTS_PER_CALL = 100  # tenant directories per find of old job logs


def log_tail(backend: SlurmBackend, job: JobRef, *, lines: int, max_bytes: int) -> LogTail:
    """The log's last bytes read as the job's identity (tail -c through the sudoers rule):
    the service user has no access to the identity's files of its own. One byte more than
    max_bytes tells whether anything came before."""
    if not job.user:
        return _legacy_log_tail(backend, job, lines=lines, max_bytes=max_bytes)
    path = f"{backend.job_dir(job.account, job.user)}/{check_token(job.token)}.out"
    limit = check_count(max(max_bytes, 0) + 1, "log bytes")
    result = backend.run(backend.as_identity(job.user, ["tail", "-c", str(limit), "--", path]))
    if result.rc != 0:
        if "No such file or directory" in result.stderr:
            return LogTail(lines=[], truncated=False)
        raise ssh.failure(replace(result, argv=["tail"]))
    data = result.stdout
    cut = len(data.encode()) > max_bytes
    text = data.splitlines()
    if cut and text:
        text = text[1:]  # the first line was cut by the byte limit
    keep = text[-lines:] if lines > 0 else []
    return LogTail(lines=keep, truncated=cut or len(keep) < len(text))


def _legacy_log_tail(backend: SlurmBackend, job: JobRef, *, lines: int, max_bytes: int) -> LogTail:
    """The log of a job submitted before jobs ran as identities: the service user wrote it,
    under its own home (or the scratch root) in <account>/<token>.out; read over SFTP."""
    root = backend.config.scratch_root.rstrip("/")
    if not root.startswith("/"):
        home = ssh.home_directory(
            backend.config, backend.connect_timeout_s, backend.command_timeout_s
        ).rstrip("/")
        root = f"{home}/{root or 'portal-jobs'}"
    path = f"{root}/{check_name(job.account, 'account')}/{check_token(job.token)}.out"
    with ssh.sftp_session(backend.config, backend.connect_timeout_s, backend.command_timeout_s) as sftp:
        try:
            size = sftp.stat(path).st_size or 0
            start = max(0, size - max(max_bytes, 0))
            with sftp.open(path, "rb") as handle:
                handle.seek(start)
                data = handle.read(size - start) if size > start else b""
        except FileNotFoundError:
            return LogTail(lines=[], truncated=False)
    text = data.decode(errors="replace").splitlines()
    if start > 0 and len(text) > 1:
        text = text[1:]  # the first line was cut by the byte limit
    keep = text[-lines:] if lines > 0 else []
    return LogTail(lines=keep, truncated=start > 0 or len(keep) < len(text))


def delete_finished(
    backend: SlurmBackend,
    accounts: list[str],
    *,
    older_than_s: int,
    dry_run: bool,
    users: dict[str, list[str]] | None = None,
) -> list[str]:
    """The job logs (<identity>/<account>/<token>.out) older than `older_than_s`, in one find
    per identity and 100 of its accounts, run as that identity; returned as
    "<account>/<token>.out". slurmctld forgets an ended job by itself (MinJobAge) and the
    accounting records are the site's to keep."""
    minutes = check_count(max(older_than_s // 60, 1), "log age in minutes")
    by_user: dict[str, list[str]] = {}
    for account in accounts:
        for user in (users or {}).get(account, []):
            by_user.setdefault(user, []).append(account)
    deleted: list[str] = []
    for user, chunk in (
        (user, owned[start : start + LOG_ACCOUNTS_PER_CALL])
        for user, owned in sorted(by_user.items())
        for start in range(0, len(owned), LOG_ACCOUNTS_PER_CALL)
    ):
        directories = [backend.job_dir(account, user) for account in chunk]
        argv = scratch.old_logs_argv(directories, older_than_minutes=minutes, dry_run=dry_run)
        result = backend.run(
            backend.as_identity(user, argv), timeout_s=max(backend.command_timeout_s, base.PURGE_TIMEOUT_S)
        )
        if result.rc not in (0, 1):  # 1: a tenant directory not made yet, or an unreadable entry
            raise ssh.failure(replace(result, argv=["find"]))
        for path in filter(None, result.stdout.split("\0")):
            directory, _slash, name = path.rpartition("/")
            deleted.append(f"{directory.rpartition('/')[2]}/{name}")
    return deleted
