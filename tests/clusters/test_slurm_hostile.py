"""A hostile tenant on the real Slurm testbed. Two tenants submit through the portal (job_submit,
jobs_dispatch: sbatch over SSH as each tenant's own identity); the attacker's job then tries every
attack of issue 16 against the victim, from inside its job, with the victim's paths, job id and
token handed to it (the worst case: it learned them). Each attack is judged from outside, as
root on this machine: Slurm's own records (scontrol, squeue, sacctmgr), the victim's files and
job, the service user's authorized_keys. The attacker's log proves that each attempt ran."""

import shlex
import subprocess
import uuid
from pathlib import Path

import pytest

from clusters.backends.base import JobRef
from clusters.services import backend_of
from jobs.models import Job
from jobs.services import JobRequest, job_log_tail, jobs_dispatch, orphans_find
from tenants.limits import tenant_apply
from tenants.models import Role, Tenant
from tests.conftest import join
from tests.factories import QuotaGrantFactory
from tests.jobs_support import submit_admitted
from tests.testbed.env import testbed_env
from tests.wait_support import wait_until

PLANTED_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostileHostileHostileHostileHostileHost attacker"

# The attacker's script: one line "ATTEMPT <name> rc=<exit status>" per attack, whatever it got.
# Its own #SBATCH lines try to move it under the victim's account and write its output elsewhere:
# the portal's options must be the only ones sbatch reads.
ATTACK = r"""#!/bin/bash
#SBATCH --account={victim_account}
#SBATCH --output=/tmp/hostile-{marker}.out
try() {{ name=$1; shift; "$@" >/dev/null 2>&1; echo "ATTEMPT $name rc=$?"; }}
show() {{ name=$1; shift; "$@" 2>&1; echo "ATTEMPT $name rc=$?"; }}  # what it got goes to its own log
show read-log cat {victim_log}
try overwrite-log sh -c 'echo pwned >> {victim_log}'
try plant-file sh -c 'echo pwned > {victim_dir}/planted'
show list-victim-tree ls -la {victim_dir}
try squat-a-tree mkdir {scratch}/pt-squat-{marker}
try cancel scancel {victim_job}
try submit-as-victim sbatch --account={victim_account} --partition=h100 --gres=gpu:h100:1 --time=2 \
    --chdir=/tmp --output=/dev/null --wrap 'sleep 100'
try lift-limits sacctmgr -i modify account where name={own_account} set GrpTRES=gres/gpu=999
try plant-ssh-key sh -c 'echo "{planted_key}" >> ~gpuportal/.ssh/authorized_keys'
squeue -h -t all -o '%i|%u|%a|%k' > seen-queue.txt 2>&1; echo "ATTEMPT read-tokens rc=$?"
grep -c {victim_token} seen-queue.txt | sed 's/^/SEEN victim-token /'
try forge-token sbatch --account={own_account} --partition=h100 --gres=gpu:h100:1 --time=2 \
    --chdir=/tmp --output=/dev/null --comment={victim_token} --wrap 'sleep 100'
try tokenless sbatch --account={own_account} --partition=h100 --gres=gpu:h100:1 --time=2 \
    --chdir=/tmp --output=/dev/null --wrap 'sleep 100'
echo "DONE as $(id -un)"
"""
VICTIM = "#!/bin/bash\necho victim-secret-{marker}\nsleep 150\n"


def root(*argv: str) -> str:
    """A command as root on the testbed's machine, outside the portal's path: the judge."""
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout


def scontrol(job_id: str) -> dict[str, str]:
    text = root("scontrol", "show", "job", "-o", job_id)
    return dict(word.split("=", 1) for word in text.split() if "=" in word)


def squeue(account: str) -> dict[str, str]:
    """Job id → "user|state|comment" of every job Slurm holds under the account, as root sees it."""
    rows = root("squeue", "-h", "-t", "all", "-A", account, "-o", "%i|%u|%T|%k").split()
    return {row.split("|", 1)[0]: row.split("|", 1)[1] for row in rows}


def assoc(account: str) -> str:
    return root("sacctmgr", "-n", "-P", "show", "assoc", "where", f"account={account}", "format=User,GrpTRES")


@pytest.fixture
def two_tenants(testbed, catalog):
    """An attacker and a victim, each with a grant and its account applied on the testbed (each
    tenant's identity pt-<slug> comes with the testbed fixture); both accounts go afterwards."""
    made = []
    for role in ("victim", "hostile"):
        tenant = Tenant.objects.create(slug=f"{role}-{uuid.uuid4().hex[:8]}", name=role.title())
        user = join(tenant, f"{tenant.slug}-member", Role.MEMBER)
        QuotaGrantFactory(tenant=tenant, pair=catalog, gpus=2)
        tenant_apply(tenant_id=tenant.pk, cluster_id=testbed.pk)
        made.append((tenant, user))
    yield made
    for tenant, _user in made:
        subprocess.run(["scancel", "-A", tenant.slug], capture_output=True, timeout=30, check=False)
        wait_until(
            lambda tenant=tenant: not root("squeue", "-h", "-A", tenant.slug, "-o", "%i").strip(),
            timeout_s=60,
            what=f"{tenant.slug}'s jobs to leave",
        )
        subprocess.run(
            ["sacctmgr", "-i", "delete", "account", f"name={tenant.slug}"], capture_output=True, timeout=30
        )


def submitted(testbed, catalog, tenant, user, script: str) -> Job:
    request = JobRequest(
        tenant=tenant, scenario=catalog[0], gpu_model=catalog[1], gpus=1, walltime_minutes=3, name="job",
        script=script, cluster=testbed, partition="h100",
    )  # fmt: skip
    job = submit_admitted(user, request)
    jobs_dispatch(job_id=job.pk, batch=1)
    job.refresh_from_db()
    assert job.backend_id.isdigit(), (job.state, job.reason)
    return job


def test_a_hostile_tenants_job_gets_through_none_of_the_attacks(testbed, catalog, two_tenants):
    (victim, victim_user), (hostile, hostile_user) = two_tenants
    env = testbed_env()
    marker = uuid.uuid4().hex
    authorized_keys = Path(root("getent", "passwd", env["SLURM_TESTBED_USER"]).split(":")[5]) / ".ssh"
    keys_before = (authorized_keys / "authorized_keys").read_bytes()
    hostile_assoc_before = assoc(hostile.slug)

    victim_job = submitted(testbed, catalog, victim, victim_user, VICTIM.format(marker=marker))
    victim_dir = Path(env["SLURM_TESTBED_SCRATCH"]) / f"pt-{victim.slug}" / victim.slug
    victim_log = victim_dir / f"{victim_job.token}.out"
    wait_until(
        lambda: victim_log.exists() and victim_log.stat().st_size,
        timeout_s=90,
        what="the victim's job to write",
    )
    victim_log_before = victim_log.read_bytes()
    assert f"victim-secret-{marker}".encode() in victim_log_before

    attack = ATTACK.format(
        victim_account=victim.slug, own_account=hostile.slug, victim_log=shlex.quote(str(victim_log)),
        victim_dir=shlex.quote(str(victim_dir)), victim_job=victim_job.backend_id,
        victim_token=victim_job.token, planted_key=PLANTED_KEY, marker=marker,
        scratch=shlex.quote(env["SLURM_TESTBED_SCRATCH"]),
    )  # fmt: skip
    hostile_job = submitted(testbed, catalog, hostile, hostile_user, attack)
    backend = backend_of(testbed)
    ended = wait_until(
        lambda: (
            (status := backend.poll([hostile_job.backend_id]).get(hostile_job.backend_id))
            and status.state in ("COMPLETED", "FAILED")
            and status
        ),
        timeout_s=90,
        interval_s=0.5,
        what="the attacker's job to end",
    )
    log = "\n".join(job_log_tail(job=Job.objects.get(pk=hostile_job.pk), lines=100).lines)
    assert ended.state == "COMPLETED" and f"DONE as pt-{hostile.slug}" in log, log
    attempts = dict(line.split()[1:3] for line in log.splitlines() if line.startswith("ATTEMPT"))
    assert len(attempts) == 12, log  # every attack ran
    assert "rc=127" not in attempts.values(), log  # and each program was there to try it with

    # Identities: each tenant's job ran as its own identity, neither as root nor as the portal's user.
    victim_record, hostile_record = scontrol(victim_job.backend_id), scontrol(hostile_job.backend_id)
    assert victim_record["UserId"].startswith(f"pt-{victim.slug}(")
    assert hostile_record["UserId"].startswith(f"pt-{hostile.slug}(")
    # The attacker's own #SBATCH lines took no effect: its account and output are the portal's.
    assert hostile_record["Account"] == hostile.slug
    assert hostile_record["StdOut"].startswith(f"{env['SLURM_TESTBED_SCRATCH']}/pt-{hostile.slug}/")
    assert not Path(f"/tmp/hostile-{marker}.out").exists()

    # Read, overwrite, plant: the victim's tree is closed to it; its log is as the victim wrote it.
    for name in ("read-log", "overwrite-log", "plant-file", "list-victim-tree"):
        assert attempts[name] != "rc=0", (name, log)
    assert victim_log.read_bytes().startswith(victim_log_before) and b"pwned" not in victim_log.read_bytes()
    assert not (victim_dir / "planted").exists()
    # Squat: the scratch root takes no new tree from a job (another identity's would be refused).
    assert attempts["squat-a-tree"] != "rc=0"
    assert not (Path(env["SLURM_TESTBED_SCRATCH"]) / f"pt-squat-{marker}").exists()
    assert f"victim-secret-{marker}" not in log
    # Cancel: the victim's job still runs.
    assert attempts["cancel"] != "rc=0"
    assert scontrol(victim_job.backend_id)["JobState"] == "RUNNING"
    # Submit under the victim's account: refused; Slurm holds only the victim's own job there.
    assert attempts["submit-as-victim"] != "rc=0"
    assert list(squeue(victim.slug)) == [victim_job.backend_id]
    # Lift its own limits: refused; the association is as the portal set it.
    assert attempts["lift-limits"] != "rc=0"
    assert assoc(hostile.slug) == hostile_assoc_before and "999" not in assoc(hostile.slug)
    # Plant an SSH key: the service user's authorized_keys are unchanged.
    assert attempts["plant-ssh-key"] != "rc=0"
    assert (authorized_keys / "authorized_keys").read_bytes() == keys_before
    # Read tokens: squeue (PrivateData=jobs) shows it only its own jobs, never the victim's token.
    seen = (Path(hostile_record["WorkDir"]) / "seen-queue.txt").read_text()  # read as root
    assert attempts["read-tokens"] == "rc=0" and hostile_job.backend_id in seen, seen
    seen_ids = {line.split("|")[0] for line in seen.splitlines()}  # a job id may be part of a slug
    assert (
        victim_job.token not in seen
        and victim_job.backend_id not in seen_ids
        and "SEEN victim-token 0" in log
    )

    # Forge a token, and run a job the portal did not submit: both go through (they are its own
    # account's), but neither is adopted as the victim's job, and both are reported as orphans.
    assert attempts["forge-token"] == "rc=0" and attempts["tokenless"] == "rc=0", log
    theirs = squeue(hostile.slug)
    forged = [job_id for job_id, row in theirs.items() if row.endswith(f"|{victim_job.token}")]
    tokenless = [job_id for job_id in theirs if job_id not in {hostile_job.backend_id, *forged}]
    assert len(forged) == 1 and len(tokenless) == 1, theirs
    victim_ref = JobRef("", victim_job.token, victim.slug, victim_job.cluster_user)
    assert backend.find_many([victim_ref]) == {victim_job.token: victim_job.backend_id}
    orphans = {row["backend_id"] for row in orphans_find(dry_run=True).orphans}
    assert {*forged, *tokenless} <= orphans and victim_job.backend_id not in orphans


def test_the_portal_user_runs_no_job_and_acts_as_no_one_outside_the_job_identities(testbed):
    """The service user's own powers, tried over its own SSH path: it may submit no job as itself
    (MaxSubmitJobs=0 on its association), and its sudoers rule lets it act only as members of
    the job identities' group, and only through the listed programs."""
    backend, env = backend_of(testbed), testbed_env()
    identity = env["SLURM_TESTBED_IDENTITY"]
    own = ["sbatch", "--parsable", f"--account={env['SLURM_TESTBED_PARENT_ACCOUNT']}", "--partition=h100",
           "--gres=gpu:h100:1", "--time=1", "--chdir=/tmp", "--output=/dev/null"]  # fmt: skip
    refused = backend.run(own, stdin="#!/bin/sh\ntrue\n")
    assert refused.rc != 0 and "AssocMaxSubmitJobLimit" in refused.stderr + refused.stdout, refused
    for user in ("root", "slurmrestd", env["SLURM_TESTBED_USER"]):
        result = backend.run(["sudo", "-n", "-u", user, "--", "tail", "-c", "0", "/dev/null"])
        assert result.rc != 0, (user, result)
    for program in (["id"], ["sh", "-c", "true"], ["cat", "/dev/null"], ["sacctmgr", "show", "user"]):
        result = backend.run(["sudo", "-n", "-u", identity, "--", *program])
        assert result.rc != 0, (program, result)
    assert backend.run(["sudo", "-n", "-u", identity, "--", "tail", "-c", "0", "/dev/null"]).rc == 0
    assert backend.identities_check([identity, "root", "no-such-identity"]) == {
        identity: "",
        "root": "jobs never run as 'root': give the tenant a cluster identity of its own",
        "no-such-identity": "no user no-such-identity on the login node",
    }
