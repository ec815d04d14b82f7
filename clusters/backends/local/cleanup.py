"""The local cluster's cleanup: the scratch purge and the retention of its own job files.

Scratch: a tenant's jobs share <scratch base>/<account> (PORTAL_SCRATCH in their environment).
The purge walks it through directory file descriptors opened with O_NOFOLLOW and unlinks each
entry relative to its directory's descriptor (as find -P does), so neither a symlink found
there nor a directory swapped for one while the purge runs can lead it outside:

    regular file older than N days       deleted, reported with its size
    symlink that resolves outside        refused and kept: never followed, so its target is safe
    other symlink older than N days      deleted: the link only, never what it points to
    directory on another filesystem      refused: not entered
    directory, fifo, socket, device      left alone (an emptied directory stays)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import time
from pathlib import Path

from clusters.backends.base import BackendError, PurgeReport

ACCOUNT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a directory name: no "/", never ".."
MAX_DEPTH = 200  # deeper than any real tree; keeps the open descriptors and the recursion bounded
GONE_PREFIX = ".gone-"  # a pruned job directory on its way out; tokens never start with "."
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
REFUSED_LINK = "symlink resolving outside the scratch directory: not followed, kept"


def check_account(account: str) -> str:
    if not isinstance(account, str) or not ACCOUNT_RE.fullmatch(account):
        raise BackendError(f"invalid account {str(account)[:70]!r}: letters, digits, '_', '.', '-' only")
    return account


def _shown(path: str) -> str:
    """A path for the report: names that are not UTF-8 with their odd bytes replaced."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class _Purge:
    def __init__(self, real_root: str, cutoff: float, dry_run: bool, dev: int):
        self.real_root, self.cutoff, self.dry_run, self.dev = real_root, cutoff, dry_run, dev
        self.deleted: list[str] = []
        self.refused: dict[str, str] = {}
        self.freed = 0

    def walk(self, fd: int, rel: str, depth: int) -> None:
        with os.scandir(fd) as entries:
            names = [entry.name for entry in entries]
        for name in names:
            path = f"{rel}{name}"
            try:
                info = os.lstat(name, dir_fd=fd)
            except FileNotFoundError:  # gone since the listing
                continue
            if stat.S_ISDIR(info.st_mode):
                self._enter(fd, name, path, info, depth)
            elif stat.S_ISLNK(info.st_mode):
                self._link(fd, name, path, rel, info)
            elif stat.S_ISREG(info.st_mode) and info.st_mtime < self.cutoff and self._unlink(fd, name, path):
                self.freed += info.st_size if info.st_nlink == 1 else 0  # only a last link frees space

    def _enter(self, fd: int, name: str, path: str, info: os.stat_result, depth: int) -> None:
        if info.st_dev != self.dev:
            self.refused[_shown(path)] = "another filesystem mounted here: not entered"
            return
        if depth >= MAX_DEPTH:
            self.refused[_shown(path)] = f"deeper than {MAX_DEPTH} directories: not entered"
            return
        try:
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:  # ELOOP: swapped for a symlink since the lstat
            self.refused[_shown(path)] = f"not entered: {exc.strerror}"
            return
        try:
            self.walk(sub, f"{path}/", depth + 1)
        except OSError as exc:
            self.refused[_shown(path)] = f"not read: {exc.strerror}"
        finally:
            os.close(sub)

    def _link(self, fd: int, name: str, path: str, rel: str, info: os.stat_result) -> None:
        try:
            target = os.readlink(name, dir_fd=fd)
        except OSError:
            return
        # realpath reads links (the whole chain) and opens nothing
        resolved = os.path.realpath(os.path.join(self.real_root, rel, target))
        if not Path(resolved).is_relative_to(self.real_root):
            self.refused[_shown(path)] = REFUSED_LINK
        elif info.st_mtime < self.cutoff:
            self._unlink(fd, name, path)

    def _unlink(self, fd: int, name: str, path: str) -> bool:
        if not self.dry_run:
            try:
                os.unlink(name, dir_fd=fd)  # unlinkat: a symlink itself, never its target
            except FileNotFoundError:
                return False
            except OSError as exc:
                self.refused[_shown(path)] = f"not deleted: {exc.strerror}"
                return False
        self.deleted.append(_shown(path))
        return True


def purge_tree(root: Path, *, older_than_days: int, dry_run: bool) -> PurgeReport:
    """Delete what is older than `older_than_days` under `root` (a tenant's scratch directory) and
    nowhere else; see the module's docstring. A root that does not exist has nothing to purge."""
    if isinstance(older_than_days, bool) or not isinstance(older_than_days, int) or older_than_days < 1:
        raise BackendError(f"invalid purge age in days {older_than_days!r}")
    try:
        fd = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        return PurgeReport(deleted=[], refused={}, bytes_freed=0, dry_run=dry_run)
    except OSError as exc:  # ELOOP: the tenant's directory is itself a symlink; ENOTDIR
        why = f"the scratch directory is not a directory ({exc.strerror}): nothing purged"
        return PurgeReport(deleted=[], refused={".": why}, bytes_freed=0, dry_run=dry_run)
    try:
        cutoff = time.time() - older_than_days * 86_400
        purge = _Purge(os.path.realpath(root), cutoff, dry_run, os.fstat(fd).st_dev)
        try:
            purge.walk(fd, "", 0)
        except OSError as exc:
            purge.refused["."] = f"not read: {exc.strerror}"
    finally:
        os.close(fd)
    return PurgeReport(purge.deleted, purge.refused, purge.freed, dry_run)


# ------------------------------------------------------------- job files --
def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None


def ended_before(jobs_dir: Path, accounts: set[str], cutoff: float, live: set[str]) -> list[tuple[str, str]]:
    """(backend id, token) of the jobs of these accounts whose final record says they ended before
    `cutoff`; tokens in `live` (the allocation state still holds them) are never taken."""
    found = []
    for job_dir in jobs_dir.iterdir():
        if job_dir.name.startswith(".") or job_dir.name in live:
            continue
        meta = job_dir / ".portal"
        end = _read(meta / "end.json")
        if end is None or (end.get("finished_at") or cutoff) >= cutoff:
            continue
        record = _read(meta / "job.json")
        if record and record.get("account") in accounts and record.get("token") == job_dir.name:
            found.append((record["id"], job_dir.name))
    return sorted(found, key=lambda item: int(item[0].rpartition("-")[2]))


def accounts_with_jobs(jobs_dir: Path) -> list[str]:
    """The accounts that have a job directory (running, waiting or ended) under jobs_dir."""
    if not jobs_dir.is_dir():
        return []
    found = set()
    for job_dir in jobs_dir.iterdir():
        if not job_dir.name.startswith(".") and (record := _read(job_dir / ".portal" / "job.json")):
            found.add(record.get("account", ""))
    return sorted(found)


def retire(root: Path, backend_id: str, token: str) -> None:
    """Under the allocation lock: the job's directory out of find()'s sight at once (a rename);
    remove_retired() deletes it after the lock is released."""
    os.rename(root / "jobs" / token, root / "jobs" / f"{GONE_PREFIX}{token}")
    with contextlib.suppress(FileNotFoundError):
        (root / "ids" / backend_id).unlink()


def remove_retired(jobs_dir: Path) -> None:
    """Delete retired job directories, those of an earlier run that died midway included.
    rmtree removes a job's symlinks without following them."""
    for path in jobs_dir.glob(f"{GONE_PREFIX}*"):
        shutil.rmtree(path, ignore_errors=True)
