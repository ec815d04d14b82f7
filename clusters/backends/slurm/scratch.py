"""The scratch purge on a Slurm login node: one GNU find that lists and deletes in one walk.

Everything happens inside that one find, with -P (a symlink is never followed, the start point
included) and -xdev (another filesystem mounted inside is not entered). find deletes each entry
with unlinkat() relative to the directory it is walking, so a job that swaps a directory for a
symlink while the purge runs cannot make it delete anything outside: there is no second command
that would take a listed path and resolve it again.

What it does with each entry under <scratch root>/<identity>/<account> (run as that identity):

    regular file older than N days       deleted (-delete), reported with its size
    symlink leading out                  refused and kept: never followed, so its target is safe
    other symlink older than N days      deleted: the link only, never what it points to
    directory, fifo, socket, device      left alone (an emptied directory stays)

"Leading out" is judged on the link's own text, by find's -lname: an absolute target outside
the tenant's directory, or any ".." component (conservative: "a/../b" is refused too).

Output records are NUL-separated, so a name with spaces, quotes, a leading dash or a newline
comes back whole, and no name is ever an argument of a command.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from clusters.backends import base
from clusters.backends.base import PurgeReport
from clusters.backends.slurm import ssh
from clusters.backends.slurm.parse import check_count, check_name

if TYPE_CHECKING:
    from clusters.backends.slurm.backend import SlurmBackend

MINUTES_PER_DAY = 1440
# The job output files sbatch writes beside the tenant's scratch (<account>/<token>.out): job
# logs, kept by the log retention (JOB_LOG_RETENTION_DAYS, delete_finished), not by the purge.
JOB_LOG_GLOB = "[0-9a-f]" * 32 + ".out"
# A find error line is not worth more than this in the report.
ERROR_CHARS = 500
REFUSED_LINK = "symlink leading outside the scratch directory: not followed, kept"
NOT_A_DIRECTORY = "the scratch directory is not a directory (type {kind}): nothing purged"


def glob_escape(path: str) -> str:
    """The path as a find -path/-lname pattern that matches only itself."""
    return "".join(f"\\{char}" if char in "*?[]\\" else char for char in path)


def purge_argv(directory: str, *, older_than_days: int, dry_run: bool) -> list[str]:
    """find's argv: records "X", type (the start point is not a directory); "R", path (a
    refused symlink); "D", type, size, link count, path (deleted, or due in a dry run). With
    -delete before -printf a "D" record is written only once the unlink succeeded."""
    pattern = glob_escape(directory)
    delete = [] if dry_run else ["-delete"]
    return [
        "find",
        "-P",
        directory,
        "-xdev",
        # the start point: only said when it is not a plain directory (a symlink is not followed)
        "(", "-path", pattern, "(", "-type", "d", "-o", "-printf", r"X\0%y\0", ")", ")",
        "-o",
        "(",
        "-type", "l",
        "(",
        "-lname", "/*", "!", "-lname", pattern, "!", "-lname", f"{pattern}/*",
        "-o", "-lname", "..", "-o", "-lname", "../*", "-o", "-lname", "*/..", "-o", "-lname", "*/../*",
        ")",
        "-printf", r"R\0%P\0",
        ")",
        "-o",
        "(",
        "(", "-type", "f", "-o", "-type", "l", ")",
        "!", "-path", f"{pattern}/{JOB_LOG_GLOB}",
        "-mmin", f"+{older_than_days * MINUTES_PER_DAY}",
        *delete,
        "-printf", r"D\0%y\0%s\0%n\0%P\0",
        ")",
    ]  # fmt: skip


def parse_report(stdout: str, *, dry_run: bool) -> PurgeReport:
    """The report from find's NUL-separated records. Bytes count regular files whose last link
    this was: removing one of several hard links frees nothing."""
    fields = stdout.split("\0")
    deleted: list[str] = []
    refused: dict[str, str] = {}
    freed, at = 0, 0
    while at < len(fields) - 1:
        kind = fields[at]
        if kind == "X":
            refused["."] = NOT_A_DIRECTORY.format(kind=fields[at + 1])
            at += 2
        elif kind == "R":
            refused[fields[at + 1]] = REFUSED_LINK
            at += 2
        elif kind == "D":
            entry_type, size, links, path = fields[at + 1 : at + 5]
            deleted.append(path)
            if entry_type == "f" and links == "1" and size.isdigit():
                freed += int(size)
            at += 5
        else:  # cannot happen with the argv above; stop rather than misread the rest
            refused["."] = f"unreadable find output at record {kind[:40]!r}: report incomplete"
            break
    return PurgeReport(deleted=deleted, refused=refused, bytes_freed=freed, dry_run=dry_run)


def with_errors(report: PurgeReport, stderr: str) -> PurgeReport:
    """find went on past entries it could not read or delete: say so under "." (its messages
    name paths on lines of their own, which a name with a newline could forge, so they are kept
    as one text, not parsed)."""
    message = " ".join(stderr.split())[:ERROR_CHARS] or "find exited with an error"
    refused = dict(report.refused)
    refused["."] = f"{refused['.']}; {message}" if "." in refused else f"incomplete: {message}"
    return PurgeReport(report.deleted, refused, report.bytes_freed, report.dry_run)


def merged(reports: list[tuple[str, PurgeReport]], *, dry_run: bool) -> PurgeReport:
    """One report of several identities' purges of one tenant: with more than one identity (the
    `user` identity mode), each path is given under its identity's name."""
    if len(reports) == 1:
        return reports[0][1]
    if not reports:
        return PurgeReport([], {}, 0, dry_run)
    deleted, refused, freed = [], {}, 0
    for user, report in reports:
        deleted += [f"{user}/{path}" for path in report.deleted]
        refused |= {f"{user}/{path}": why for path, why in report.refused.items()}
        freed += report.bytes_freed
    return PurgeReport(deleted, refused, freed, dry_run)


def old_logs_argv(directories: list[str], *, older_than_minutes: int, dry_run: bool) -> list[str]:
    """find's argv for the job logs (<token>.out right under each tenant directory) older than
    the retention: each printed as "<tenant directory>/<name>", NUL-separated, once deleted."""
    delete = [] if dry_run else ["-delete"]
    return [
        "find", "-P", *directories, "-mindepth", "1", "-maxdepth", "1", "-xdev", "-type", "f",
        "-name", JOB_LOG_GLOB, "-mmin", f"+{older_than_minutes}", *delete, "-printf", r"%p\0",
    ]  # fmt: skip


def purge_scratch(
    backend: SlurmBackend, account: str, *, older_than_days: int, dry_run: bool, users: tuple[str, ...] = ()
) -> PurgeReport:
    """Per identity of the account, one find under <scratch root>/<identity>/<account>, run
    as that identity, that lists and deletes in the same walk (this module says what it
    deletes and refuses, and why no second command touches a path): the purge can delete
    nothing the tenant's own jobs could not. A directory not made yet has nothing to purge."""
    days = check_count(older_than_days, "purge age in days")
    check_name(account, "account")
    reports: list[tuple[str, PurgeReport]] = []
    for user in sorted(set(users)):
        directory = backend.job_dir(account, user)
        result = backend.run(
            backend.as_identity(user, purge_argv(directory, older_than_days=days, dry_run=dry_run)),
            timeout_s=max(backend.command_timeout_s, base.PURGE_TIMEOUT_S),
        )
        report = parse_report(result.stdout, dry_run=dry_run)
        if result.rc != 0 and not (not result.stdout and "No such file or directory" in result.stderr):
            if result.rc != 1:  # 1: find went on past an entry it could not read or delete
                raise ssh.failure(replace(result, argv=["find"]))
            report = with_errors(report, result.stderr)
        reports.append((user, report))
    return merged(reports, dry_run=dry_run)
