"""Submitting jobs in batches (one SSH exec of many sbatch calls) and finding the portal's jobs
by their token (--comment): find_many for known tokens, list_jobs for every job of the accounts."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from clusters.backends import base
from clusters.backends.base import BackendError, BackendUnavailable, JobRef, JobSpec, SchedulerJob
from clusters.backends.slurm import sbatch, ssh
from clusters.backends.slurm.parse import (
    BATCH_EXIT_MKTEMP,
    SBATCH_BATCH_SH,
    TOKEN_RE,
    batch_answers,
    batch_job_lines,
    check_count,
    check_name,
    check_token,
    portal_state,
    sbatch_job_id,
    split_rows,
)

if TYPE_CHECKING:
    from clusters.backends.slurm.backend import SlurmBackend

# Accounts per squeue of list_jobs: 500 names of at most 64 characters keep it near 32 kB.
ACCOUNT_CHUNK = 500


def submit_many(backend: SlurmBackend, specs: list[JobSpec]) -> list[str | BackendError | None]:
    """Submit several jobs in one SSH exec: a fixed remote script (parse.SBATCH_BATCH_SH)
    creates the jobs' directories and calls sbatch once per job, each job's options and
    script arriving on stdin as data. Answers per spec, in order: the Slurm job id; a
    BackendError for a job refused for good (a spec that fails its checks, or sbatch's no);
    BackendUnavailable for a transient refusal (sbatch exited: the job is not submitted, or
    find(token) will know); or None when the batch was cut off before that job's answer
    came (timeout, connection lost): it may or may not have been submitted. Raises
    BackendUnavailable (or BackendError) when nothing could run: no connection, no
    temporary file on the login node."""
    results: list[str | BackendError | None] = [None] * len(specs)
    parts: dict[str, tuple[int, str]] = {}  # token → (index in specs, its stdin lines)
    for index, spec in enumerate(specs):
        try:
            if spec.token in parts:
                raise BackendError(f"job token {spec.token} twice in one batch")
            argv, script, directory = sbatch.sbatch_request(backend, spec)
            parts[spec.token] = (index, batch_job_lines(spec.token, spec.user, directory, argv, script))
        except BackendError as exc:
            results[index] = exc
    if not parts:
        return results
    stdin = "".join(lines for _index, lines in parts.values())
    result = backend.run(
        ["sh", "-c", SBATCH_BATCH_SH],
        stdin=stdin,
        timeout_s=min(2 * backend.command_timeout_s, backend.command_timeout_s + len(parts)),
        partial=True,
    )
    if result.rc == BATCH_EXIT_MKTEMP:  # before any sbatch
        raise ssh.failure(replace(result, argv=["mktemp"]))
    answers = batch_answers(result.stdout)
    for token, (index, _lines) in parts.items():
        if token not in answers:
            continue  # never reached (rc 0 or 64: not submitted) or cut off (rc None): unknown
        rc, text = answers[token]
        job_id = sbatch_job_id(text) if rc == 0 else None
        if job_id:
            results[index] = job_id
        elif rc == 0:
            results[index] = BackendError(f"sbatch answered {text[:200]!r}, not a job id")
        else:
            results[index] = ssh.failure(ssh.CommandResult(["sbatch"], rc, "", text))
    if result.rc is not None and result.rc >= 0:
        # The script exited (not killed: the shell waits for each sbatch), so a job it did not
        # answer was never reached. Cut off or killed, an sbatch may still be on its way: unknown.
        for index in (index for index, _lines in parts.values() if results[index] is None):
            results[index] = BackendUnavailable(f"sbatch batch ended with {result.rc}: {result.message}")
    return results


def find_many(backend: SlurmBackend, jobs: list[JobRef]) -> dict[str, str]:
    """The jobs submitted with these tokens, token → job id (the oldest, should a token be
    there twice: the portal's own submission came first, a copy after it), in one squeue and,
    for the tokens squeue does not know, one sacct, over the jobs' accounts and identities.
    A scheduler job counts only when its token, account and user are all the portal job's:
    another identity's job that copied a token (or a job submitted by hand under the
    tenant's account) is never adopted. A token left out is unknown to both."""
    owners = {
        check_token(job.token): (
            check_name(job.account, "account").lower(),
            check_name(backend.legacy_user(job.user), "cluster identity"),
        )
        for job in jobs
    }
    found = _queued_ids(backend, owners) if owners else {}
    if missing := {token: owner for token, owner in owners.items() if token not in found}:
        found |= _accounted_ids(backend, missing)
    return {token: min(ids, key=int) for token, ids in found.items()}


def _queued_ids(backend: SlurmBackend, owners: dict[str, tuple[str, str]]) -> dict[str, list[str]]:
    """slurmctld's jobs (pending, running, ended less than MinJobAge ago) of these accounts,
    comment included. The service user is an Operator: PrivateData does not hide them from it."""
    accounts = ",".join(sorted({account for account, _user in owners.values()}))
    argv = ["squeue", "-h", "-t", "all", "-A", accounts, "-o", "%i|%a|%u|%k"]
    found: dict[str, list[str]] = {}
    for job_id, account, user, comment in split_rows(backend.check(argv), 4):
        if owners.get(comment) == (account.lower(), user) and job_id.isdigit():
            found.setdefault(comment, []).append(job_id)
    return found


def _accounted_ids(backend: SlurmBackend, owners: dict[str, tuple[str, str]]) -> dict[str, list[str]]:
    """slurmdbd's jobs of the last find_window_days under these accounts. Its Comment stays
    empty unless slurm.conf has AccountingStoreFlags=job_comment, but 22.05 stores the
    SubmitLine, which holds our --comment=<token> (the script came on stdin: a short line)."""
    window = f"now-{check_count(backend.find_window_days, 'find window')}days"
    accounts = ",".join(sorted({account for account, _user in owners.values()}))
    argv = ["sacct", "-X", "-P", "-n", "-a", "-A", accounts, "-S", window]
    stdout = backend.check([*argv, "-o", "JobID,Account,User,Comment,SubmitLine"])
    found: dict[str, list[str]] = {}
    for job_id, account, user, comment, submit_line in split_rows(stdout, 5):
        if not job_id.isdigit():
            continue
        words = submit_line.split()
        flags = {word.removeprefix("--comment=") for word in words if word.startswith("--comment=")}
        for token in ({comment} | flags) & owners.keys():
            if owners[token] == (account.lower(), user):
                found.setdefault(token, []).append(job_id)
    return found


def list_jobs(backend: SlurmBackend, accounts: list[str]) -> list[SchedulerJob]:
    """One squeue per ACCOUNT_CHUNK accounts, every user's jobs under them: the token is
    the job's --comment (what find() reads too; "" when the comment is not a token). squeue
    alone: sacct's jobs have ended, and an ended job is no orphan."""
    # sacctmgr keeps account names in lower case, and squeue prints them so
    by_name = {check_name(account, "account").lower(): account for account in accounts}
    names = sorted(by_name)
    jobs = []
    for start in range(0, len(names), ACCOUNT_CHUNK):
        chunk = ",".join(names[start : start + ACCOUNT_CHUNK])
        # -t all, filtered here: one table (parse.STATES) says what has ended, as for poll
        stdout = backend.check(["squeue", "-h", "-t", "all", "-A", chunk, "-o", "%i|%a|%T|%u|%k"])
        for job_id, account, raw_state, user, comment in split_rows(stdout, 5):
            state = portal_state(raw_state, started=False)
            if account.lower() not in by_name or state in base.END_STATES:
                continue
            token = comment if TOKEN_RE.fullmatch(comment) else ""
            jobs.append(SchedulerJob(job_id, token, by_name[account.lower()], state, user=user))
    return jobs
