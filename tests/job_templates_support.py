"""Shared by the job template tests: parameter sets, a fake-tool harness, helpers."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.job_templates import BACKEND_KINDS, TEMPLATES, TemplateInvalid, render_template

# The least each template needs, and every parameter set.
MINIMAL = {
    "python": {"script": "train.py"},
    "torchrun": {"script": "train.py"},
    "horovod": {"script": "train.py"},
    "gromacs": {},
    "lammps": {"input": "in.lj"},
    "openfoam": {},
}
FULL = {
    "python": {"script": "src/train.py", "args": ["--lr", "3e-4", "a b"], "venv": "venv"},
    "torchrun": {
        "script": "src/train.py",
        "args": ["--epochs=2", "it's"],
        "venv": ".venv",
        "rdzv_port": 29400,
        "max_restarts": 2,
    },
    "horovod": {"script": "train.py", "args": ["--batch", "64"], "venv": "env/hvd"},
    "gromacs": {
        "deffnm": "run1/md",
        "mdp": "md.mdp",
        "coordinates": "conf.gro",
        "topology": "topol.top",
        "maxwarn": 1,
        "nonbonded": "cpu",
        "pme": "cpu",
        "nsteps": 1000,
        "resume": False,
    },
    "lammps": {
        "input": "in.lj",
        "binary": "lmp_mpi",
        "accelerator": "gpu",
        "variables": {"n": "10", "T": "1.5e0"},
        "ranks_per_node": 8,
    },
    "openfoam": {
        "case_dir": "cases/cavity",
        "solver": "icoFoam",
        "bashrc": "/opt/openfoam11/etc/bashrc",
        "block_mesh": True,
        "decompose_method": "simple",
        "ranks_per_node": 2,
    },
}

FAKE_TOOLS = [
    "torchrun",
    "mpirun",
    "srun",
    "scontrol",
    "python3",
    "gmx_mpi",
    "lmp",
    "lmp_mpi",
    "lmp_kokkos_cuda_mpi",
    "blockMesh",
    "decomposePar",
    "foamDictionary",
    "reconstructPar",
    "icoFoam",
    "simpleFoam",
]
# Real tools the scripts use themselves; touch is there so that an injected `touch` would work.
REAL_TOOLS = ["sed", "cat", "touch"]

FAKE = """#!{python}
import json, os, sys

name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps([name, *args]) + "\\n")
# The environment the real tool would start with (and hand its workers).
with open(os.environ["FAKE_ENV_LOG"], "a") as log:
    log.write(json.dumps([name, dict(os.environ)]) + "\\n")
if name == "scontrol" and args[:2] == ["show", "hostnames"]:
    print("node-a\\nnode-b\\nnode-c")
elif name in ("srun", "mpirun"):
    # Skip the launcher's own options and start the program once, as rank 0 would be.
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if name == "mpirun" else 1
    os.execvp(args[i], args[i:])
"""


def cases():
    for slug, template in TEMPLATES.items():
        for kind in BACKEND_KINDS:
            shapes = [1, 3] if kind in template.multi_node_backends else [1]
            for nodes in shapes:
                for label, params in (("minimal", MINIMAL[slug]), ("full", FULL[slug])):
                    yield pytest.param(slug, kind, nodes, params, id=f"{slug}-{kind}-{nodes}n-{label}")


def make_fakebin(tmp_path: Path) -> Path:
    fakebin = tmp_path / "fakebin"
    if fakebin.exists():
        return fakebin
    fakebin.mkdir()
    for name in FAKE_TOOLS:
        tool = fakebin / name
        tool.write_text(FAKE.format(python=sys.executable))
        tool.chmod(0o755)
    for name in REAL_TOOLS:
        (fakebin / name).symlink_to(shutil.which(name))
    return fakebin


def run_script(script: str, tmp_path: Path, *, env: dict[str, str] | None = None, cwd: Path | None = None):
    """Run the script with bash, only the fakes on PATH; the completed process and the calls made
    (each call's environment: environments_of)."""
    fakebin = make_fakebin(tmp_path)
    log = tmp_path / "calls.jsonl"
    log.write_text("")
    env_log = tmp_path / "environments.jsonl"
    env_log.write_text("")
    path = tmp_path / "job.sh"
    path.write_text(script)
    work = cwd or tmp_path / "work"
    work.mkdir(exist_ok=True)
    done = subprocess.run(
        ["/bin/bash", str(path)],
        cwd=work,
        env={
            "PATH": str(fakebin),
            "FAKE_LOG": str(log),
            "FAKE_ENV_LOG": str(env_log),
            "OMP_NUM_THREADS": "4",
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return done, calls


def calls_of(calls, name):
    return [call[1:] for call in calls if call[0] == name]


def environments_of(tmp_path: Path, name: str) -> list[dict[str, str]]:
    """The environment of each call of the fake tool `name` in the last run_script."""
    rows = [json.loads(line) for line in (tmp_path / "environments.jsonl").read_text().splitlines()]
    return [environ for tool, environ in rows if tool == name]


def invalid(
    slug, params, *, nodes=1, gpus_per_node=4, backend_kind="slurm", vendor="nvidia"
) -> dict[str, list[str]]:
    with pytest.raises(TemplateInvalid) as raised:
        render_template(
            slug, params, nodes=nodes, gpus_per_node=gpus_per_node, backend_kind=backend_kind, vendor=vendor
        )
    return raised.value.errors


SLURM_ENV = {"SLURM_JOB_NODELIST": "node-[a-c]", "SLURM_JOB_ID": "4242", "SLURM_CPUS_ON_NODE": "16"}
