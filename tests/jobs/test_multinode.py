"""A multi-node template renders and runs: the lammps template rendered for 2 nodes x 1 GPU,
submitted through the real SlurmBackend (SSH as the portal user, sbatch, squeue/sacct) to the
testbed's two nodes (tests/testbed/testbed.sh), CPU-only. The script's srun starts one LAMMPS
rank per node and Slurm wires them into one MPI world through PMIx. No mocks.

The tenant gets an account of its own (apply_tenant, as the portal makes them), so the job's
working directory is its own too; the account and the directory are removed in a finally."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import uuid
from pathlib import Path

from clusters.backends import base
from clusters.backends.base import JobRef, JobSpec, TenantLimits
from clusters.backends.slurm import SlurmBackend
from jobs.job_templates import render_template
from tests.slurm_support import delete_account, wait_for_end
from tests.testbed.env import testbed_config as make_config
from tests.testbed.env import testbed_env
from tests.wait_support import wait_until

NODES = 2
POLL_S = 1.0
JOB_TIMEOUT_S = 180

# Lennard-Jones liquid, the LAMMPS "in.lj" benchmark in a box twice as long in x as in y and z, so
# that two ranks split it along x ("2 by 1 by 1"). ${cells} comes from the template's variables.
LJ_INPUT = """\
units           lj
atom_style      atomic
lattice         fcc 0.8442
region          box block 0 ${cells} 0 10 0 10
create_box      1 box
create_atoms    1 box
mass            1 1.0
velocity        all create 3.0 87287 loop geom
pair_style      lj/cut 2.5
pair_coeff      1 1 1.0 1.0 2.5
neighbor        0.3 bin
neigh_modify    delay 0 every 20 check no
fix             1 all nve
run             100
"""


def hostnames(backend: SlurmBackend, node_list: str) -> list[str]:
    return backend.check(["scontrol", "show", "hostnames", node_list]).split()


def test_lammps_template_runs_one_mpi_rank_on_each_of_two_nodes():
    env = testbed_env()
    assert int(env["SLURM_TESTBED_NODES"]) >= NODES, env
    backend = SlurmBackend(make_config())
    account = f"mn{uuid.uuid4().hex[:10]}"
    token = uuid.uuid4().hex
    input_name = f"{token}.in"
    script = render_template(
        "lammps",
        # Debian's lmp has no KOKKOS or GPU package: plain styles, on the CPU
        {"input": input_name, "binary": "lmp", "accelerator": "none", "variables": {"cells": "20"}},
        nodes=NODES,
        gpus_per_node=1,
        backend_kind="slurm",
    )
    assert f"srun --nodes={NODES} --ntasks={NODES} --ntasks-per-node=1" in script, script
    spec = JobSpec(
        token=token,
        name="multinode-lammps",
        account=account,
        qos="portal-normal",
        priority="normal",
        partition="h100",
        gpu_type="h100",
        k8s_resource="nvidia.com/gpu",
        k8s_product="",
        gpus_per_node=1,
        nodes=NODES,
        walltime_minutes=3,
        script=script,
        # The testbed's nodes are one machine reached at 127.0.0.1: Open MPI's TCP transport,
        # which it picks between ranks of different nodes, must use the loopback it skips by default.
        env={"OMP_NUM_THREADS": "1", "OMPI_MCA_btl_tcp_if_include": "lo"},
        cpus_per_gpu=1,
        mem_per_gpu_mb=500,
        user=env["SLURM_TESTBED_IDENTITY"],
    )
    directory = backend.job_dir(account, spec.user)
    job_id = None
    try:
        backend.apply_tenant(TenantLimits(account, "portal-normal", [spec.user], {"h100": NODES}, 600))
        # the input beside the job's output, in the identity's own tree (the testbed is this machine)
        identity = pwd.getpwnam(spec.user)
        for path in (Path(directory).parent, Path(directory)):
            path.mkdir(mode=0o700, exist_ok=True)
            os.chown(path, identity.pw_uid, identity.pw_gid)
        Path(directory, input_name).write_text(LJ_INPUT)
        job_id = backend.submit(spec)

        status = wait_for_end(backend, job_id, timeout=JOB_TIMEOUT_S)
        tail = backend.log_tail(JobRef(job_id, token, account, spec.user), lines=200, max_bytes=65536)
        output = "\n".join(tail.lines)
        assert (status.state, status.raw_state, status.exit_code) == (
            base.JobState.COMPLETED,
            "COMPLETED",
            0,
        ), (
            status,
            output,
        )

        # Slurm: the job held both nodes, and its one step ran one task on each of them. Read from
        # sacct once it has caught up: for a second or so after the end, slurmdbd's record (and so
        # status.node_list) may still name only the first node.
        def accounted(argv: list[str], nodes: int) -> list[str] | None:
            row = backend.check(["sacct", "-n", "-P", *argv]).strip().split("|")
            return row if row[0] and len(set(hostnames(backend, row[0]))) == nodes else None

        (job_nodes,) = wait_until(
            lambda: accounted(["-X", "-j", job_id, "-o", "NodeList"], NODES),
            timeout_s=30,
            interval_s=POLL_S,
            what=f"sacct to record job {job_id} on {NODES} nodes",
        )
        step_nodes, step_tasks, step_state = wait_until(
            lambda: accounted(["-j", f"{job_id}.0", "-o", "NodeList,NTasks,State"], NODES),
            timeout_s=30,
            interval_s=POLL_S,
            what=f"sacct to record step {job_id}.0 on {NODES} nodes",
        )
        assert hostnames(backend, step_nodes) == hostnames(backend, job_nodes), (job_nodes, step_nodes)
        assert (step_tasks, step_state) == (str(NODES), "COMPLETED")

        # LAMMPS: one run, of one MPI world of two ranks that split the box between them. Ranks that
        # PMIx failed to join would each run alone ("1 by 1 by 1", "on 1 procs"), twice over.
        assert "2 by 1 by 1 MPI processor grid" in output, output
        assert "1 by 1 by 1" not in output, output
        assert re.search(r"^Created 8000 atoms$", output, re.M), output
        loops = re.findall(
            r"^Loop time of [0-9.e+-]+ on (\d+) procs for 100 steps with 8000 atoms$", output, re.M
        )
        assert loops == ["2"], output
        assert re.search(r"% CPU use with 2 MPI tasks x 1 OpenMP threads$", output, re.M), output
        assert output.count("Total wall time:") == 1, output
    finally:
        delete_account(backend, account)
        shutil.rmtree(directory, ignore_errors=True)
