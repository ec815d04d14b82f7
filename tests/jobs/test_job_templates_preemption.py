"""Job templates: checkpoints kept across a preemption warning and resumed in the next attempt, for
each family against its stand-ins and for real LAMMPS."""

import re
import shutil
import signal
import time

from jobs.job_templates import render_template
from tests.job_templates_support import (
    CONTROL_DICT,
    RESUMED,
    SLURM_ENV,
    calls_of,
    environments_of,
    make_fakebin,
    markers,
    openfoam_case,
    run_script,
    start_script,
)

# --- Preemption: checkpoint on the warning, resume in the next attempt ---------------------------
#
# Each family runs twice against stand-ins that behave like their tools: attempt 1 gets the
# warning (USR1, as Slurm sends it to the batch shell) and must save, print the marker and exit
# promptly; attempt 2 must resume from that checkpoint. FAKE_MINUTE_S makes a "minute" short.

WARNED = 128 + signal.SIGUSR1  # a job stopped on the warning exits as one killed by it
FAST = {"FAKE_MINUTE_S": "0.3", "PORTAL_CHECKPOINT_POLL_S": "0.1", "PORTAL_PREEMPT_SIGNAL": "USR1"}

# A training program that keeps the contract (README, "The checkpoint contract for job scripts").
TRAIN = """
import os, signal, sys, time

path = os.path.join(os.environ["PORTAL_CHECKPOINT_DIR"], "model.pt")
step = 0
if os.path.exists(path):
    step = int(open(path).read())
    print(f"PORTAL_RESUMED {int(time.time())} {path} step {step}", flush=True)
stopping = []
signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
every_s = int(os.environ["PORTAL_CHECKPOINT_MINUTES"]) * 60


def save():
    with open(path + ".tmp", "w") as out:
        out.write(str(step))
    os.replace(path + ".tmp", path)  # whole or not at all
    print(f"PORTAL_CHECKPOINT {int(time.time())} step {step}", flush=True)


print(f"training from step {step}", flush=True)
saved = time.monotonic()
while step < int(os.environ["TRAIN_STEPS"]):
    if stopping:
        save()
        sys.exit(0)
    time.sleep(0.01)
    step += 1
    if time.monotonic() - saved >= every_s:
        save()
        saved = time.monotonic()
save()
"""


def test_torchrun_hands_the_warning_to_the_training_which_resumes(tmp_path):
    script = render_template(
        "torchrun", {"script": "train.py"}, nodes=1, gpus_per_node=2, backend_kind="slurm"
    )
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    checkpoints = tmp_path / "scratch" / "checkpoints" / "job-1"
    env = {**SLURM_ENV, **FAST, "PORTAL_CHECKPOINT_DIR": str(checkpoints), "TRAIN_STEPS": "100000"}

    job = start_script(script, tmp_path, env={**env, "PORTAL_ATTEMPT": "1"}, cwd=work)
    job.wait_for(lambda: "training from step 0" in job.out, "the training's start")
    job.signal(signal.SIGUSR1)
    assert job.finish(timeout_s=20) == WARNED, job.err
    saved = int((checkpoints / "model.pt").read_text())
    ((epoch, what),) = markers(job.out)
    assert what == f"step {saved}"
    assert int(job.started_at) <= epoch <= time.time()
    (environ,) = environments_of(tmp_path, "torchrun")
    assert (environ["PORTAL_CHECKPOINT_DIR"], environ["PORTAL_CHECKPOINT_MINUTES"]) == (
        str(checkpoints),
        "15",
    )

    job = start_script(
        script, tmp_path, env={**env, "PORTAL_ATTEMPT": "2", "TRAIN_STEPS": str(saved + 20)}, cwd=work
    )
    assert job.finish(timeout_s=20) == 0, job.err
    ((_, resumed),) = RESUMED.findall(job.out)
    assert resumed == f"{checkpoints}/model.pt step {saved}"
    assert environments_of(tmp_path, "torchrun")[0]["PORTAL_ATTEMPT"] == "2"


def test_gromacs_checkpoints_on_its_interval_and_on_the_warning_then_resumes(tmp_path):
    params = {"checkpoint_minutes": 1}
    script = render_template("gromacs", params, nodes=1, gpus_per_node=2, backend_kind="slurm")
    checkpoints = tmp_path / "ck"
    cpt = checkpoints / "state.cpt"
    env = {**SLURM_ENV, **FAST, "PORTAL_CHECKPOINT_DIR": str(checkpoints)}

    job = start_script(script, tmp_path, env=env)
    # mdrun writes one every -cpt minutes; the script reports each once it is there.
    job.wait_for(lambda: markers(job.out), "a periodic checkpoint's marker")
    job.signal(signal.SIGUSR1)
    assert job.finish(timeout_s=20) == WARNED, job.err
    # srun would kill its tasks: Slurm itself hands mdrun the TERM, and mdrun saves and stops.
    assert calls_of(job.calls, "scancel") == [["--signal=TERM", "4242"]]
    stopped = int(re.search(r"stopped at step (\d+) on a signal", job.out)[1])
    assert int(cpt.read_text()) == stopped
    found = markers(job.out)
    assert len(found) >= 2 and {what for _, what in found} == {"state.cpt"}
    assert found[-1][0] == int(cpt.stat().st_mtime)
    assert (tmp_path / "work" / "md.cpt").read_text() == str(stopped)  # for a later job's -cpi

    job = start_script(script, tmp_path, env={**env, "PORTAL_ATTEMPT": "2", "FAKE_STEPS": str(stopped + 30)})
    assert job.finish(timeout_s=20) == 0, job.err
    (mdrun,) = calls_of(job.calls, "gmx_mpi")
    # This working directory has no md.log to append to: mdrun writes new parts.
    assert mdrun[mdrun.index("-cpi") :] == ["-cpi", str(cpt), "-noappend"]
    assert f"mdrun: resuming from {cpt} at step {stopped}" in job.out
    assert RESUMED.findall(job.out)[0][1] == str(cpt)


def test_lammps_writes_restarts_stops_at_the_warning_and_resumes(tmp_path):
    params = {"input": "in.lj", "checkpoint_minutes": 1}
    script = render_template("lammps", params, nodes=1, gpus_per_node=2, backend_kind="local")
    checkpoints = tmp_path / "ck"
    env = {**FAST, "PORTAL_CHECKPOINT_DIR": str(checkpoints)}

    job = start_script(script, tmp_path, env=env)
    # A restart file is whole once LAMMPS has begun the next one.
    job.wait_for(lambda: markers(job.out), "a periodic restart file's marker")
    assert markers(job.out)[0][1] == "restart.a"
    job.signal(signal.SIGUSR1)
    assert job.finish(timeout_s=20) == WARNED, job.err
    halted = int(re.search(r"met on step (\d+)", job.out)[1])
    assert int((checkpoints / "restart.final").read_text()) == halted
    assert markers(job.out)[-1][1] == "restart.final"
    assert (checkpoints / "latest").read_text() == "restart.final\n"

    job = start_script(script, tmp_path, env={**env, "PORTAL_ATTEMPT": "2", "FAKE_STEPS": str(halted + 30)})
    assert job.finish(timeout_s=20) == 0, job.err
    resume = checkpoints / "restart.resume"
    (lmp,) = calls_of(job.calls, "lmp")
    assert lmp[lmp.index("portal_resume") + 1 : lmp.index("portal_restart") + 2] == [
        "1",
        "-var",
        "portal_restart",
        str(resume),
    ]
    assert f"lmp: read_restart {resume}: step {halted}" in job.out
    assert RESUMED.findall(job.out)[0][1] == str(resume)
    assert not (checkpoints / "restart.final").exists()


def test_openfoam_writes_times_stops_at_the_warning_and_resumes(tmp_path):
    _, case = openfoam_case(tmp_path, with_dict=False)
    params = {"case_dir": "cases/cavity", "solver": "icoFoam", "ranks_per_node": 2, "checkpoint_minutes": 1}
    script = render_template("openfoam", params, nodes=1, gpus_per_node=2, backend_kind="local")
    checkpoints = tmp_path / "ck"
    env = {**FAST, "PORTAL_CHECKPOINT_DIR": str(checkpoints)}

    job = start_script(script, tmp_path, env=env)
    job.wait_for(lambda: markers(job.out), "a periodic time directory's marker")
    job.signal(signal.SIGUSR1)
    assert job.finish(timeout_s=20) == WARNED, job.err
    stopped = re.search(r"stopAt writeNow: wrote time (\d+)", job.out)[1]
    assert markers(job.out)[-1][1] == f"time {stopped}"
    for proc in ("processor0", "processor1"):
        assert (checkpoints / proc / stopped / "U").read_text() == stopped
    assert (checkpoints / "latest").read_text() == f"{stopped}\n"
    assert (case / "system" / "controlDict").read_text() == CONTROL_DICT  # no stopAt writeNow left
    assert calls_of(job.calls, "reconstructPar") == []  # no time for it: the next attempt goes on

    job = start_script(script, tmp_path, env={**env, "PORTAL_ATTEMPT": "2", "FAKE_STEPS": "20"})
    assert job.finish(timeout_s=20) == 0, job.err
    assert calls_of(job.calls, "decomposePar") == []  # the decomposed case is the checkpoint's
    assert ["-entry", "startTime", "-set", stopped, "system/controlDict"] in calls_of(
        job.calls, "foamDictionary"
    )
    assert f"Starting time loop from {stopped}" in job.out
    assert RESUMED.findall(job.out)[0][1] == f"time {stopped}"
    assert calls_of(job.calls, "reconstructPar") == [["-latestTime"]]
    assert (case / "system" / "controlDict").read_text() == CONTROL_DICT


def test_a_warning_before_the_application_starts_stops_the_job_at_once(tmp_path):
    # grompp in the foreground: the handler runs when it returns, and mdrun never starts.
    params = {"mdp": "md.mdp", "coordinates": "c.gro", "topology": "t.top"}
    script = render_template("gromacs", params, nodes=1, gpus_per_node=1, backend_kind="kubernetes")
    script = script.replace("gmx_mpi grompp", "kill -USR1 $$; gmx_mpi grompp", 1)
    done, calls = run_script(script, tmp_path, env={"PORTAL_CHECKPOINT_DIR": str(tmp_path / "ck")})
    assert done.returncode == WARNED
    assert [call[0] for call in calls] == ["gmx_mpi"]  # grompp only


# A LAMMPS input that keeps the portal's contract (README): it resumes from ${portal_restart},
# includes ${portal_checkpoint} once its box exists and runs `run N upto`.
PORTAL_AWARE_INPUT = """variable portal_resume index 0
variable portal_checkpoint index /dev/null
units lj
atom_style atomic
if "${portal_resume}" then "read_restart ${portal_restart}" else "lattice fcc 0.8442" &
  "region box block 0 5 0 5 0 5" "create_box 1 box" "create_atoms 1 box" "mass 1 1.0" &
  "velocity all create 3.0 87287 loop geom"
pair_style lj/cut 2.5
pair_coeff 1 1 1.0 1.0 2.5
fix 1 all nve
thermo 100
include ${portal_checkpoint}
run ${steps} upto
print "done at step $(step)"
"""


def test_real_lammps_halts_at_the_warning_and_resumes_from_its_restart_file(tmp_path):
    # The files the template writes for LAMMPS, read by LAMMPS itself (CI installs Debian's lammps).
    assert shutil.which("lmp"), "LAMMPS is required for this test: apt-get install -y lammps"
    fakebin = make_fakebin(tmp_path, real=("lmp",))
    work = tmp_path / "work"
    work.mkdir()
    (work / "in.lj").write_text(PORTAL_AWARE_INPUT)
    checkpoints = tmp_path / "ck"
    env = {
        # After the stand-ins, the system's tools: a lone MPI process starts Open MPI's orted.
        "PATH": f"{fakebin}:/usr/bin:/bin",
        "PORTAL_CHECKPOINT_DIR": str(checkpoints),
        "PORTAL_PREEMPT_SIGNAL": "USR1",
        "OMP_NUM_THREADS": "1",
    }

    def script(steps: int) -> str:
        params = {
            "input": "in.lj",
            "binary": "lmp",
            "accelerator": "none",
            "variables": {"steps": str(steps)},
        }
        return render_template("lammps", params, nodes=1, gpus_per_node=1, backend_kind="local")

    job = start_script(script(10**7), tmp_path, env=env, cwd=work)
    job.wait_for(lambda: re.search(r"^\s+200 ", job.out, re.M), "LAMMPS's step 200", timeout_s=60)
    job.signal(signal.SIGUSR1)
    assert job.finish(timeout_s=60) == WARNED, job.out + job.err
    halted = int(re.search(r"Fix halt condition for fix-id portal_halt met on step (\d+)", job.out)[1])
    # The last restart file, at the halt, reported once whole; the one of step 100 before it when
    # the tracker's beat saw it first (under load the warning can come before that beat).
    assert [what for _, what in markers(job.out)] in (["restart.a", "restart.final"], ["restart.final"])
    assert (checkpoints / "latest").read_text() == "restart.final\n"

    job = start_script(script(halted + 200), tmp_path, env={**env, "PORTAL_ATTEMPT": "2"}, cwd=work)
    assert job.finish(timeout_s=60) == 0, job.out + job.err
    assert "Reading restart file ..." in job.out
    assert RESUMED.findall(job.out)[0][1] == str(checkpoints / "restart.resume")
    assert f"done at step {halted + 200}" in job.out
