"""A tenant's Slurm account, users, QOS and GPU limits, kept in step with sacctmgr.

Everything is read first (three `sacctmgr -P -n show` commands) and only what differs is
written, so a second run with the same limits writes nothing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from clusters.backends.base import BackendError, TenantLimits
from clusters.backends.slurm import ssh
from clusters.backends.slurm.parse import check_count, check_name, tres

if TYPE_CHECKING:
    from clusters.backends.slurm.backend import SlurmBackend

logger = logging.getLogger(__name__)

PARENT = "portal"  # every tenant's account sits under this one
# One QOS per tier; Priority counts only where slurm.conf gives PriorityWeightQOS a weight.
TIERS = {"portal-low": 10, "portal-normal": 100, "portal-high": 1000, "portal-critical": 10000}
# Jobs on GPUs lent by another tenant (jobs.services.dispatch.BORROW_QOS): below every tier,
# which preempt it (slurm.conf: PreemptType=preempt/qos); REQUEUE, after GraceTime. The portal's
# own jobs there are --no-requeue, so that a preemption ends them and the portal restarts them.
BORROW_QOS, BORROW_PRIORITY = "portal-borrow", 0
QOS_FIELDS = "Name,Priority,Preempt,PreemptMode,GraceTime"
ASSOC_FIELDS = "Account,User,ParentName,GrpTRES,GrpTRESMins,QOS,DefaultQOS"


def apply_tenant(backend: SlurmBackend, limits: TenantLimits) -> None:
    # sacctmgr keeps account and user names in lower case: compare them that way
    account = check_name(limits.account, "account").lower()
    if account == PARENT:
        raise BackendError(f"{PARENT!r} is the portal's parent account, not a tenant's")
    users = {check_name(user, "user").lower() for user in limits.users}
    qos = check_name(limits.qos, "QOS")
    for gpu_type, count in limits.gpus_by_type.items():
        check_name(gpu_type, "GPU type")
        check_count(count, f"GPU count for {gpu_type}", minimum=0)
    check_count(limits.gpu_minutes, "GPU minutes", minimum=0)
    cluster = [f"cluster={check_name(backend.config.slurm_cluster_name, 'cluster')}"] * bool(
        backend.config.slurm_cluster_name
    )

    _ensure_tiers(backend, qos)
    check_count(limits.shards, "shard count", minimum=0)
    grp_tres = _grp_tres(backend, limits.gpus_by_type, limits.shards)
    settings = [
        "GrpTRES=" + ",".join(f"{name}={value}" for name, value in grp_tres.items()),
        f"GrpTRESMins=gres/gpu={limits.gpu_minutes}",
        f"QOS={qos},{BORROW_QOS}",
        f"DefaultQOS={qos}",
    ]

    condition = ["where", f"account={PARENT},{account}", *cluster]
    rows = backend.check(["sacctmgr", "-P", "-n", "show", "assoc", *condition, f"format={ASSOC_FIELDS}"])
    assocs = [dict(zip(ASSOC_FIELDS.split(","), row.split("|"), strict=False)) for row in rows.splitlines()]
    parent_rows = [row for row in assocs if row["Account"] == PARENT and not row["User"]]
    account_rows = [row for row in assocs if row["Account"] == account and not row["User"]]
    user_rows = [row for row in assocs if row["Account"] == account and row["User"]]
    about = ["description=GPU portal", "organization=portal"]

    if not parent_rows:
        backend.check(["sacctmgr", "-i", "add", "account", f"name={PARENT}", *cluster, *about])
    if not account_rows:
        backend.check(
            [
                "sacctmgr",
                "-i",
                "add",
                "account",
                f"name={account}",
                f"parent={PARENT}",
                *cluster,
                *about,
                *settings,
            ]
        )
    else:
        where = ["where", f"name={account}", *cluster, "set"]
        if account_rows[0]["ParentName"] != PARENT:
            backend.check(["sacctmgr", "-i", "modify", "account", *where, f"parent={PARENT}"])
        current = account_rows[0]
        current_tres, current_mins = tres(current["GrpTRES"]), tres(current["GrpTRESMins"])
        stale = (
            any(current_tres.get(name) != str(value) for name, value in grp_tres.items())
            or current_mins.get("gres/gpu") != str(limits.gpu_minutes)
            # `modify account … set QOS` also sets the users' associations under it: check theirs too
            or any(
                set(row["QOS"].split(",")) != {qos, BORROW_QOS} or row["DefaultQOS"] != qos
                for row in [current, *user_rows]
            )
        )
        if stale:
            backend.check(["sacctmgr", "-i", "modify", "account", *where, *settings])

    present = {row["User"] for row in user_rows}
    if missing := sorted(users - present):
        # a new user association copies the account's QOS list and default at creation
        backend.check(
            ["sacctmgr", "-i", "add", "user", f"name={','.join(missing)}", f"account={account}", *cluster]
        )
    if extra := sorted(present - users):
        # Slurm refuses while such a user still has jobs under the account (the service user's
        # association after an upgrade to identities, until its last job ends): the limits above
        # hold already, so the account is applied; the next apply deletes it.
        argv = ["sacctmgr", "-i", "delete", "user", "where", f"name={','.join(extra)}", f"account={account}"]
        result = backend.run([*argv, *cluster])
        if result.rc != 0:
            if "job(s) active" not in result.message.lower():
                raise ssh.failure(result)
            logger.info(
                "cluster %s: %s keep their association under %s until their jobs end",
                backend.config.slug,
                extra,
                account,
            )


def _ensure_tiers(backend: SlurmBackend, qos: str) -> None:
    """The tier QOS with their priorities, each preempting the borrowing QOS, and that one with
    its PreemptMode and GraceTime. Creating or changing a QOS needs a Slurm Administrator: an
    Operator is refused, which stops the tenant only when its own QOS is missing (BackendError
    saying what an admin runs once); a differing setting is logged."""
    rows = backend.check(["sacctmgr", "-P", "-n", "show", "qos", f"format={QOS_FIELDS}"])
    existing = {row.split("|", 1)[0]: row.split("|") for row in rows.splitlines() if "|" in row}
    refused = []
    for name, wanted in _qos_wanted(backend.config.preempt_grace_s).items():
        current = dict(zip(QOS_FIELDS.split(","), existing.get(name, []), strict=False))
        if name in existing and all(
            _qos_value(key, current.get(key, "")) == value for key, value in wanted.items()
        ):
            continue
        settings = [f"{key.lower()}={value}" for key, value in wanted.items()]
        if name in existing:
            argv = ["sacctmgr", "-i", "modify", "qos", "where", f"name={name}", "set", *settings]
        else:
            argv = ["sacctmgr", "-i", "add", "qos", f"name={name}", *settings]
        result = backend.run(argv)
        if result.rc == 0:
            existing[name] = [name]
        elif any(word in result.message.lower() for word in ("permission denied", "privilege")):
            refused.append(f"sacctmgr -i {' '.join(argv[2:])}")
        else:
            raise ssh.failure(result)
    if qos not in existing:
        hint = f"; a Slurm administrator runs once: {'; '.join(refused)}" if refused else ""
        raise BackendError(f"QOS {qos!r} does not exist on the cluster{hint}")
    if refused:
        logger.warning(
            "cluster %s: may not set up the tier QOS; an admin runs: %s", backend.config.slug, refused
        )


def _qos_wanted(grace_s: int) -> dict[str, dict[str, str]]:
    """QOS name → the settings the portal keeps on it (sacctmgr's words); the borrowing QOS
    first, since the tiers name it."""
    wanted = {
        BORROW_QOS: {
            "Priority": str(BORROW_PRIORITY),
            "PreemptMode": "requeue",
            "GraceTime": str(check_count(grace_s, "grace time")),
        }
    }
    return wanted | {name: {"Priority": str(p), "Preempt": BORROW_QOS} for name, p in TIERS.items()}


def _qos_value(key: str, shown: str) -> str:
    """A QOS setting as sacctmgr shows it, in the words it is set with: GraceTime in seconds
    ("00:05:00" → "300"), PreemptMode in lower case."""
    if key == "GraceTime" and ":" in shown:
        days, _sep, clock = shown.rpartition("-")
        hours, minutes, seconds = (int(part) for part in clock.split(":"))
        return str(int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds)
    return shown.lower() if key == "PreemptMode" else shown


def _grp_tres(backend: SlurmBackend, gpus_by_type: dict[str, int], shards: int = 0) -> dict[str, int]:
    """gres/gpu=<sum> and gres/gpu:<type>=<n> for every GPU type Slurm tracks (a MIG profile is a
    type: gres/gpu:3g.71gb), 0 for types without a grant, so that a grant taken away takes its
    GPUs away too; gres/shard=<n> where Slurm tracks shards."""
    rows = backend.check(["sacctmgr", "-P", "-n", "show", "tres", "format=Type,Name"])
    names = [name for kind, _bar, name in (row.partition("|") for row in rows.splitlines()) if kind == "gres"]
    tracked = sorted(name.removeprefix("gpu:") for name in names if name.startswith("gpu:"))
    if untracked := sorted(set(gpus_by_type) - set(tracked)):
        raise BackendError(
            f"GPU type(s) {', '.join(untracked)} not tracked by Slurm: add gres/gpu:TYPE to "
            "AccountingStorageTRES in slurm.conf"
        )
    if shards and "shard" not in names:
        raise BackendError("Shards untracked by Slurm: add gres/shard to slurm.conf's AccountingStorageTRES")
    limits = {"gres/gpu": sum(gpus_by_type.values())}
    limits.update({f"gres/gpu:{gpu_type}": gpus_by_type.get(gpu_type, 0) for gpu_type in tracked})
    if "shard" in names:
        limits["gres/shard"] = shards
    return limits
