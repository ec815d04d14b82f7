"""The scratch tree every backend's purge is judged on (the local backend's under tmp_path, the
Slurm testbed's on this machine): old and recent files, names a shell would mangle, links out of
the tree and a hard link to a file outside; and what a purge, or a dry run, must leave of it."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from clusters.backends.base import PurgeReport

DAY_S = 86_400
PURGE_DAYS = 30
OLD_S = 40 * DAY_S


@dataclass(frozen=True)
class ScratchTree:
    root: Path  # the tenant's scratch directory
    outside: Path  # a directory beside it that the purge must never touch
    deleted: set[str]  # paths relative to root that a purge removes
    kept: set[str]  # paths relative to root that stay
    refused: set[str]  # symlinks leading out: reported, kept
    bytes_freed: int


def build_scratch_tree(root: Path, outside: Path) -> ScratchTree:
    """Old and recent files, names a shell would mangle, symlinks out of root (kept) and in it
    (an old link goes, its target stays), and a hard link to a file outside."""
    now = time.time()
    old: dict[str, int] = {
        "old.bin": 1000,
        "sub/deep/old-deep.dat": 500,
        " spaced name": 11,
        "quote'\"s `$(touch pwned)`": 7,
        "-leading-dash": 13,
        "new\nline": 17,
    }
    recent = {"new.txt": 10, "-recent dash": 3, "sub/fresh\nname": 5}
    for rel, size in {**old, **recent}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x" * size)
    outside.mkdir(parents=True, exist_ok=True)
    (outside / "secret").write_text("keep me")
    (outside / "hardfile").write_text("shared inode")
    os.link(outside / "hardfile", root / "hard-outside")  # same inode: deleting this name frees nothing
    os.symlink(outside / "secret", root / "escape")
    os.symlink(os.path.relpath(outside / "secret", root), root / "rel-escape")
    os.symlink(outside, root / "sub" / "escape-dir")
    os.symlink("new.txt", root / "inner-link")  # inside: an old link is removed, never new.txt
    for rel in [*old, "hard-outside"]:
        os.utime(root / rel, (now - OLD_S, now - OLD_S))
    for rel in ("escape", "rel-escape", "sub/escape-dir", "inner-link"):
        os.utime(root / rel, (now - OLD_S, now - OLD_S), follow_symlinks=False)
    os.utime(outside / "secret", (now - OLD_S, now - OLD_S))
    return ScratchTree(
        root=root,
        outside=outside,
        deleted={*old, "hard-outside", "inner-link"},
        kept={*recent},
        refused={"escape", "rel-escape", "sub/escape-dir"},
        bytes_freed=sum(old.values()),
    )


def assert_purged(tree: ScratchTree, report: PurgeReport) -> None:
    assert sorted(report.deleted) == sorted(tree.deleted)
    assert set(report.refused) == tree.refused
    assert all("outside" in reason for reason in report.refused.values())
    assert report.bytes_freed == tree.bytes_freed
    for rel in tree.deleted:
        assert not os.path.lexists(tree.root / rel), rel
    for rel in tree.kept | tree.refused:
        assert os.path.lexists(tree.root / rel), rel
    assert (tree.outside / "secret").read_text() == "keep me"
    assert (tree.outside / "hardfile").read_text() == "shared inode"
    assert os.path.isdir(tree.root / "sub" / "deep")  # directories stay


def assert_untouched(tree: ScratchTree, report: PurgeReport) -> None:
    """A dry run: the same report, nothing gone."""
    assert report.dry_run
    assert sorted(report.deleted) == sorted(tree.deleted)
    assert set(report.refused) == tree.refused
    assert report.bytes_freed == tree.bytes_freed
    for rel in tree.deleted | tree.kept | tree.refused:
        assert os.path.lexists(tree.root / rel), rel
