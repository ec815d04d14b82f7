"""Shared by the job template tests: parameter sets, a fake-tool harness, helpers, an OpenFOAM case."""

import json
import re
import shutil
import subprocess
import sys
import time
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
        "checkpoint_minutes": 30,
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
        "checkpoint_minutes": 5,
    },
    "lammps": {
        "input": "in.lj",
        "binary": "lmp_mpi",
        "accelerator": "gpu",
        "variables": {"n": "10", "T": "1.5e0"},
        "ranks_per_node": 8,
        "checkpoint_minutes": 60,
    },
    "openfoam": {
        "case_dir": "cases/cavity",
        "solver": "icoFoam",
        "bashrc": "/opt/openfoam11/etc/bashrc",
        "block_mesh": True,
        "decompose_method": "simple",
        "ranks_per_node": 2,
        "checkpoint_minutes": 1440,
    },
}

FAKE_TOOLS = [
    "torchrun",
    "mpirun",
    "srun",
    "scontrol",
    "scancel",
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
REAL_TOOLS = ["sed", "cat", "touch", "mkdir", "rm", "mv", "cp", "ln", "stat", "sleep"]

# Each stand-in records its argv and environment. The launchers start the program they launch.
# With FAKE_MINUTE_S set (seconds that stand for one minute), mdrun, LAMMPS and the OpenFOAM
# solvers also simulate: steps every 10 ms up to FAKE_STEPS, checkpoints at the interval the
# template asked for, a stop with a checkpoint as the real tool stops, and a resume from one.
FAKE = r"""#!@PYTHON@
import json, os, re, signal, subprocess, sys, time

name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps([name, *args]) + "\n")
# The environment the real tool would start with (and hand its workers).
with open(os.environ["FAKE_ENV_LOG"], "a") as log:
    log.write(json.dumps([name, dict(os.environ)]) + "\n")
MINUTE_S = float(os.environ.get("FAKE_MINUTE_S", "0"))
STEPS = int(os.environ.get("FAKE_STEPS", "1000000"))
stop = []


def on_term(signum, frame):
    stop.append(signum)


def option(flag, default=None):
    return args[args.index(flag) + 1] if flag in args[:-1] else default


def write(path, text):
    with open(path, "w") as out:
        out.write(text)


def mdrun():
    # gmx mdrun: -cpt minutes between checkpoints, written as state_step<N>.cpt and renamed over
    # -cpo (the previous one kept as _prev); -cpi resumes; SIGTERM: a checkpoint, then exit 0.
    cpo, cpi = option("-cpo"), option("-cpi")
    step = 0
    if cpi and not cpi.startswith("-") and os.path.exists(cpi):
        step = int(open(cpi).read())
        print(f"mdrun: resuming from {cpi} at step {step}", flush=True)
    signal.signal(signal.SIGTERM, on_term)
    interval, last = float(option("-cpt")) * MINUTE_S, time.monotonic()

    def checkpoint():
        temp = os.path.join(os.path.dirname(cpo), f"state_step{step}.cpt")
        write(temp, str(step))
        if os.path.exists(cpo):
            os.replace(cpo, cpo[: -len(".cpt")] + "_prev.cpt")
        os.replace(temp, cpo)

    while step < STEPS and not stop:
        time.sleep(0.01)
        step += 1
        if time.monotonic() - last >= interval:
            checkpoint()
            last = time.monotonic()
    checkpoint()
    print(f"mdrun: stopped at step {step}" + (" on a signal" if stop else ""), flush=True)


def lammps():
    # LAMMPS on a portal-aware input: read_restart ${portal_restart} when ${portal_resume} is 1,
    # then what the include file and the driver that the template wrote ask for.
    var = {args[i + 1]: args[i + 2] for i, arg in enumerate(args[:-2]) if arg == "-var"}
    include = open(var["portal_checkpoint"]).read()
    driver = open(option("-in")).read()
    stop_file = re.search(r"is_file\((\S+)\)", include)[1]
    files = re.search(r"restart v_portal_next (\S+) (\S+)", include).groups()
    interval = int(re.search(r"ceil\((\d+) \*", include)[1]) / 60 * MINUTE_S
    final = re.search(r'then "write_restart (\S+)"', driver)[1]
    step, written, last = 0, 0, time.monotonic()
    if var["portal_resume"] == "1":
        step = int(open(var["portal_restart"]).read())
        print(f"lmp: read_restart {var['portal_restart']}: step {step}", flush=True)
    while step < STEPS:
        time.sleep(0.01)
        step += 1
        if step % 10 == 0 and os.path.exists(stop_file):
            print(f"Fix halt condition for fix-id portal_halt met on step {step}", flush=True)
            write(final, str(step))
            return
        if time.monotonic() - last >= interval:
            write(files[written % 2], str(step))
            written, last = written + 1, time.monotonic()


def controldict():
    text = open("system/controlDict").read()
    return dict(re.findall(r"^\s*(\w+)\s+([^;]*);", text, re.M))


def solver():
    # An OpenFOAM solver run in parallel: time directories in every processor*, at the
    # controlDict's clockTime writeInterval; it reads controlDict again at every time step and
    # stops at stopAt writeNow after writing the current time.
    procs = sorted(d for d in os.listdir(".") if d.startswith("processor"))
    settings = controldict()
    t = int(settings["startTime"]) if settings.get("startFrom") == "startTime" else 0
    print(f"Starting time loop from {t}", flush=True)
    interval, last = float(settings["writeInterval"]) / 60 * MINUTE_S, time.monotonic()

    def write_time():
        for proc in procs:
            os.makedirs(f"{proc}/{t}", exist_ok=True)
            write(f"{proc}/{t}/U", str(t))

    for _ in range(STEPS):
        time.sleep(0.01)
        t += 1
        if controldict().get("stopAt") == "writeNow":
            write_time()
            print(f"stopAt writeNow: wrote time {t}", flush=True)
            return
        if time.monotonic() - last >= interval:
            write_time()
            last = time.monotonic()
    write_time()


if name == "scontrol" and args[:2] == ["show", "hostnames"]:
    print("node-a\nnode-b\nnode-c")
elif name == "scancel" and args[0].startswith("--signal="):
    # Slurm signals the tasks of the job's steps, not the batch step.
    sig = getattr(signal, "SIG" + args[0].split("=", 1)[1])
    for pid in open(os.environ["FAKE_LOG"] + ".steps").read().split():
        try:
            os.kill(int(pid), sig)
        except ProcessLookupError:
            pass
elif name in ("srun", "mpirun"):
    if name == "srun":
        with open(os.environ["FAKE_LOG"] + ".steps", "a") as steps:
            steps.write(f"{os.getpid()}\n")
    # Skip the launcher's own options and start the program once, as rank 0 would be.
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if name == "mpirun" else 1
    os.execvp(args[i], args[i:])
elif name == "torchrun":
    # Starts the training script, when there is one, as its one worker, and hands a SIGTERM on
    # to it (torch.distributed.elastic: the agent's death signal goes to the workers).
    script = next(arg for arg in args if not arg.startswith("-"))
    if os.path.exists(script):
        worker = subprocess.Popen([sys.executable, *args[args.index(script) :]])
        signal.signal(signal.SIGTERM, lambda signum, frame: worker.send_signal(signal.SIGTERM))
        sys.exit(worker.wait())
elif name == "python3" and args and os.path.exists(args[0]):
    os.execv(sys.executable, [sys.executable, *args])
elif name == "decomposePar":
    count = int(re.search(r"numberOfSubdomains\s+(\d+)", open("system/decomposeParDict").read())[1])
    for proc in range(count):
        os.makedirs(f"processor{proc}/0", exist_ok=True)
elif name == "foamDictionary" and "-set" in args:
    entry, value, path = option("-entry"), option("-set"), args[-1]
    text = open(path).read() if os.path.exists(path) else ""
    line = f"{entry} {value};"
    text, count = re.subn(rf"^\s*{entry}\s+[^;]*;", line, text, flags=re.M)
    write(path, text if count else text + line + "\n")
elif MINUTE_S and name == "gmx_mpi" and args[:1] == ["mdrun"]:
    mdrun()
elif MINUTE_S and name.startswith("lmp"):
    lammps()
elif MINUTE_S and name.endswith("Foam"):
    solver()
"""


def cases():
    for slug, template in TEMPLATES.items():
        for kind in BACKEND_KINDS:
            shapes = [1, 3] if kind in template.multi_node_backends else [1]
            for nodes in shapes:
                for label, params in (("minimal", MINIMAL[slug]), ("full", FULL[slug])):
                    yield pytest.param(slug, kind, nodes, params, id=f"{slug}-{kind}-{nodes}n-{label}")


def make_fakebin(tmp_path: Path, *, real: tuple[str, ...] = ()) -> Path:
    """The stand-ins, and the real tools named in `real` under their own names."""
    fakebin = tmp_path / "fakebin"
    if fakebin.exists():
        return fakebin
    fakebin.mkdir()
    for name in FAKE_TOOLS:
        tool = fakebin / name
        if name in real:
            tool.symlink_to(shutil.which(name))
            continue
        tool.write_text(FAKE.replace("@PYTHON@", sys.executable))
        tool.chmod(0o755)
    for name in REAL_TOOLS:
        (fakebin / name).symlink_to(shutil.which(name))
    return fakebin


def _prepare(script: str, tmp_path: Path, env: dict[str, str] | None, cwd: Path | None):
    fakebin = make_fakebin(tmp_path)
    for name in ("calls.jsonl", "calls.jsonl.steps", "environments.jsonl"):
        (tmp_path / name).write_text("")
    path = tmp_path / "job.sh"
    path.write_text(script)
    work = cwd or tmp_path / "work"
    work.mkdir(exist_ok=True)
    environ = {
        "PATH": str(fakebin),
        "FAKE_LOG": str(tmp_path / "calls.jsonl"),
        "FAKE_ENV_LOG": str(tmp_path / "environments.jsonl"),
        "OMP_NUM_THREADS": "4",
        **(env or {}),
    }
    return ["/bin/bash", str(path)], work, environ


def _calls(tmp_path: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]


def run_script(script: str, tmp_path: Path, *, env: dict[str, str] | None = None, cwd: Path | None = None):
    """Run the script with bash, only the fakes on PATH; the completed process and the calls made
    (each call's environment: environments_of)."""
    argv, work, environ = _prepare(script, tmp_path, env, cwd)
    done = subprocess.run(argv, cwd=work, env=environ, capture_output=True, text=True, timeout=60)
    return done, _calls(tmp_path)


class Running:
    """A job script started in the background, its output going to files that the test reads
    while it runs. Every wait is bounded."""

    def __init__(self, script: str, tmp_path: Path, *, env: dict[str, str] | None, cwd: Path | None):
        argv, work, environ = _prepare(script, tmp_path, env, cwd)
        self.tmp_path = tmp_path
        self.out_path, self.err_path = tmp_path / "job.out", tmp_path / "job.err"
        with self.out_path.open("w") as out, self.err_path.open("w") as err:
            self.process = subprocess.Popen(argv, cwd=work, env=environ, stdout=out, stderr=err)
        self.started_at = time.time()  # wall-clock, as the markers' epochs

    @property
    def out(self) -> str:
        return self.out_path.read_text()

    @property
    def err(self) -> str:
        return self.err_path.read_text()

    @property
    def calls(self) -> list[list[str]]:
        return _calls(self.tmp_path)

    def wait_for(self, predicate, what: str, *, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if self.process.poll() is not None:
                raise AssertionError(
                    f"the job ended ({self.process.returncode}) before {what}:\n{self.out}{self.err}"
                )
            if time.monotonic() > deadline:
                self.process.kill()
                raise AssertionError(f"no {what} within {timeout_s} s:\n{self.out}{self.err}")
            time.sleep(0.05)

    def signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    def finish(self, *, timeout_s: float = 30.0) -> int:
        """The job's exit status; it must end within timeout_s."""
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
            raise AssertionError(f"the job did not end within {timeout_s} s:\n{self.out}{self.err}") from None


def start_script(script: str, tmp_path: Path, *, env: dict[str, str] | None = None, cwd: Path | None = None):
    return Running(script, tmp_path, env=env, cwd=cwd)


MARKER = re.compile(r"^PORTAL_CHECKPOINT (\d{9,11})(?: (.*))?$", re.M)
RESUMED = re.compile(r"^PORTAL_RESUMED (\d{9,11}) (.+)$", re.M)


def markers(out: str) -> list[tuple[int, str]]:
    """The checkpoint markers in a job's output, as the portal reads them (jobs/services/attempts.py)."""
    return [(int(epoch), what or "") for epoch, what in MARKER.findall(out)]


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


# An OpenFOAM case for the openfoam template (tests/jobs/test_job_templates_simulation.py, _preemption.py).
CONTROL_DICT = """FoamFile { version 2.0; format ascii; class dictionary; object controlDict; }
application icoFoam;
startFrom startTime;
startTime 0;
stopAt endTime;
endTime 0.5;
deltaT 0.005;
writeControl timeStep;
writeInterval 20;
runTimeModifiable true;
"""


def openfoam_case(tmp_path: Path, *, with_dict: bool) -> tuple[Path, Path]:
    bashrc = tmp_path / "openfoam" / "etc" / "bashrc"
    bashrc.parent.mkdir(parents=True)
    # Like the real one: reads unset variables and its last command may fail.
    bashrc.write_text('export WM_PROJECT=OpenFOAM\n: "$FOAM_UNSET_THING"\nfalse\n')
    case = tmp_path / "work" / "cases" / "cavity"
    (case / "system").mkdir(parents=True)
    (case / "system" / "controlDict").write_text(CONTROL_DICT)
    if with_dict:
        (case / "system" / "decomposeParDict").write_text("numberOfSubdomains 2;\nmethod hierarchical;\n")
    return bashrc, case
