"""molecular-dynamics: GROMACS and LAMMPS, one MPI rank per GPU under srun (Slurm) or mpirun.

Both run on NVIDIA, AMD and Hygon GPUs with the same command lines: what differs is the build the
site installed (CUDA, or HIP/SYCL), not the switches. Neither has a build for Huawei Ascend or
Cambricon accelerators, so on those the templates refuse (field `gpu_model`) rather than run on
the CPU while the job is charged for NPUs or MLUs.

Checkpoints (the checkpoint contract, base.py): mdrun writes its own every checkpoint_minutes
into the checkpoint directory, and a last one when the preemption warning reaches it as a
SIGTERM. LAMMPS writes restart files as the portal's include file tells it, in an input script
that takes the include in, and stops at the stop file that the warning creates.
"""

from __future__ import annotations

from typing import Any

from .base import (
    RANKS_PER_NODE,
    VAR_NAME,
    WORD,
    JobTemplate,
    Shape,
    checkpoint_lines,
    checkpoint_minutes,
    exit_lines,
    forward_lines,
    header,
    launch_lines,
    mpi_launch,
    preempt_lines,
    q,
    relpath,
    schema,
    tracker_end_lines,
    tracker_lines,
    tracker_start_lines,
)

SCENARIO = "molecular-dynamics"

# GROMACS offloads to NVIDIA GPUs through CUDA, to AMD ones through SYCL (AdaptiveCpp) and, since
# 2025, HIP ("Added support to compile GROMACS using AMD HIP as GPU backend",
# https://manual.gromacs.org/current/release-notes/2025/major/portability.html); -nb and -pme take
# the same values on each. Hygon's DCU toolkit (DTK) is ROCm-based and programs DCUs through HIP
# (Hygon's own documentation was not reachable when this was written). The scenario's
# GMX_ENABLE_DIRECT_GPU_COMM is not CUDA's alone: SYCL builds use GPU-aware MPI since 2023,
# ROCm-aware Open MPI included (https://gitlab.com/gromacs/gromacs/-/issues/4638), and HIP builds
# since 2026 (https://manual.gromacs.org/current/release-notes/2026/major/portability.html). mdrun
# uses it only where it detects GPU-aware MPI and stages through the host otherwise, so it stays
# set on every vendor. LAMMPS's KOKKOS package builds for CUDA and HIP
# (https://docs.lammps.org/Speed_kokkos.html) and its GPU package for CUDA, HIP and OpenCL
# (https://docs.lammps.org/Speed_gpu.html), each taking the same -k/-sf/-pk switches.
MD_VENDORS = frozenset({"nvidia", "amd", "hygon"})

# OMP_NUM_THREADS comes from the scenario's env (4 for MD); a default keeps `set -u` quiet when
# a job's env drops it.
OMP_THREADS = '"${OMP_NUM_THREADS:-1}"'


def render_gromacs(values: dict[str, Any], shape: Shape) -> list[str]:
    deffnm = values["deffnm"]
    srun = shape.backend_kind == "slurm"
    # The handler first: a warning during grompp stops the job before mdrun starts.
    lines = [
        *header("gromacs", shape),
        *checkpoint_lines(values),
        *preempt_lines(forward_lines(shape, srun=srun, mpirun=not srun)),
    ]
    if "mdp" in values:
        # grompp is serial and quick: it runs once here, in the batch step, before the ranks start.
        lines += [
            f"gmx_mpi grompp -f {q(values['mdp'])} -c {q(values['coordinates'])} -p {q(values['topology'])} "
            f"-o {q(deffnm + '.tpr')} -maxwarn {int(values['maxwarn'])}",
            "",
        ]
    setup, launcher = mpi_launch(shape, ranks_per_node=shape.gpus_per_node)
    lines += [
        # mdrun writes state_step<N>.cpt and then renames it to state.cpt, keeping the one before
        # as state_prev.cpt (GROMACS, Managing long simulations, https://manual.gromacs.org/current/
        # user-guide/managing-simulations.html): a state.cpt is always whole.
        'cpt="$PORTAL_CHECKPOINT_DIR/state.cpt"',
        "mdrun_resume=()",
        'cpt_seen=""',
        "if [[ -f $cpt ]]; then",
        '  mdrun_resume=(-cpi "$cpt")',
        # Appending needs the output files the checkpoint names; a new working directory (another
        # pod's) has none, and mdrun then writes numbered parts (<name>.part0002.log…) instead.
        f"  if [[ ! -f {q(deffnm + '.log')} ]]; then mdrun_resume+=(-noappend); fi",
        "  cpt_seen=$(stat -c '%i %Y' -- \"$cpt\")",
        "  printf 'PORTAL_RESUMED %(%s)T %s\\n' -1 \"$cpt\"",
    ]
    if values["resume"]:
        # -cpi alone continues from <deffnm>.cpt of an earlier job when it exists and starts
        # afresh when it does not.
        lines += ["else", "  mdrun_resume=(-cpi)"]
    lines += [
        "fi",
        # Each checkpoint is a new file (the rename): its inode tells two apart within a second.
        "record_checkpoints() {",
        "  local seen",
        "  if [[ ! -f $cpt ]]; then return; fi",
        "  seen=$(stat -c '%i %Y' -- \"$cpt\") || return 0",
        '  if [[ $seen != "$cpt_seen" ]]; then',
        "    cpt_seen=$seen",
        '    echo "PORTAL_CHECKPOINT ${seen#* } state.cpt"',
        "  fi",
        "}",
        "",
    ]
    mdrun = [
        f"gmx_mpi mdrun -deffnm {q(deffnm)} -ntomp {OMP_THREADS}",
        f"-nb {q(values['nonbonded'])}",
        f"-pme {q(values['pme'])}",
        # -cpt: minutes between checkpoints (gmx mdrun, https://manual.gromacs.org/current/
        # onlinehelp/gmx-mdrun.html); mdrun writes one more at its last step, a stop on a signal's
        # included (Halting running simulations, https://manual.gromacs.org/current/user-guide/
        # mdrun-features.html).
        f'-cpt {int(values["checkpoint_minutes"])} -cpo "$cpt"',
        '${mdrun_resume[@]+"${mdrun_resume[@]}"}',
    ]
    if "nsteps" in values:
        mdrun.append(f"-nsteps {int(values['nsteps'])}")
    return [
        *lines,
        *setup,
        *launch_lines(f"{launcher} {' '.join(mdrun)}", poll=True),
        "record_checkpoints",
        # The run name's checkpoint as well, where a later job that continues the run looks (-cpi).
        f'if [[ -f $cpt ]]; then cp -p -- "$cpt" {q(deffnm + ".cpt")}; fi',
        *exit_lines(),
    ]


ACCELERATOR_FLAGS = {
    "kokkos": lambda gpus: f"-k on g {gpus} -sf kk",
    "gpu": lambda gpus: f"-sf gpu -pk gpu {gpus}",
    "opt": lambda gpus: "-sf opt",
    "none": lambda gpus: "",
}


# Executables named for one device API: LAMMPS's `make kokkos_cuda_mpi` target builds for CUDA only.
BINARY_VENDORS = {"lmp_kokkos_cuda_mpi": frozenset({"nvidia"})}


def check_lammps(values: dict[str, Any], shape: Shape) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    vendors = BINARY_VENDORS.get(values["binary"])
    if vendors is not None and shape.vendor not in vendors:
        errors["parameters.binary"] = [
            f"{values['binary']} is LAMMPS's KOKKOS build for CUDA (NVIDIA GPUs). On this GPU model use "
            "lmp or lmp_mpi built with KOKKOS for HIP, or with the GPU package."
        ]
    if any(name.startswith("portal_") for name in values["variables"]):
        errors["parameters.variables"] = ["Names starting with portal_ are the template's own."]
    return errors


# The include file that a portal-aware input script takes in once its box exists (`include
# ${portal_checkpoint}`). Restart files every checkpoint_minutes of wall-clock time: LAMMPS counts
# restarts in steps (restart, https://docs.lammps.org/restart.html, "N can be a variable"), so the
# next one is this run's pace so far (elapsed steps over `cpu`, its wall-clock seconds) times the
# interval, and 100 steps on from its first step, when there is no pace yet. Two files in turn,
# so one is always whole. The run stops at the stop file (fix halt with is_file(), the example in
# https://docs.lammps.org/fix_halt.html); `error soft` skips the input's later runs too and goes
# on with its other commands, the driver's write_restart last.
LAMMPS_CHECKPOINT = [
    "# Written by the portal's LAMMPS template. The input script includes it once its box exists.",
    "variable portal_stop equal is_file($ck/stop)",
    "fix portal_halt all halt 100 v_portal_stop != 0 error soft message yes",
    'variable portal_next equal "step + 100*(elapsed == 0) + ceil({seconds} * elapsed / (cpu + 1e-9))"',
    "restart v_portal_next $ck/restart.a $ck/restart.b",
]
# The input LAMMPS reads: the job's own, then, when the stop file halted it, the state it stopped
# at (write_restart, https://docs.lammps.org/write_restart.html).
LAMMPS_DRIVER = [
    "# Written by the portal's LAMMPS template: the job's input, then its state if a preemption stopped it.",
    "include {input}",
    'if "\\$(is_file($ck/stop)) != 0" then "write_restart $ck/restart.final"',
]


def render_lammps(values: dict[str, Any], shape: Shape) -> list[str]:
    ranks_per_node = int(values.get("ranks_per_node", shape.gpus_per_node))
    setup, launcher = mpi_launch(shape, ranks_per_node=ranks_per_node)
    seconds = 60 * int(values["checkpoint_minutes"])
    command = [
        q(values["binary"]),
        ACCELERATOR_FLAGS[values["accelerator"]](shape.gpus_per_node),
        '-in "$lammps_input"',
        # The input script resumes with `if "${portal_resume}" then "read_restart ${portal_restart}"
        # else <its own box>` and runs `run N upto`, so that a resumed run ends where it would have.
        '-var portal_resume "$resume" -var portal_restart "$restart_from"',
        '-var portal_checkpoint "$lammps_checkpoint"',
    ]
    command += [f"-var {q(name)} {q(value)}" for name, value in values["variables"].items()]
    return [
        *header("lammps", shape),
        *setup,
        *checkpoint_lines(values),
        "ck=$PORTAL_CHECKPOINT_DIR",
        'rm -f -- "$ck/stop"',
        f"lammps_input={q(values['input'])}",
        "lammps_checkpoint=/dev/null",
        "restart_from=none",
        "resume=0",
        # LAMMPS reads the directory's name in its own input syntax, where blanks, quotes, $, # and
        # a restart file name's * and % mean something.
        "if [[ $ck =~ ^/[A-Za-z0-9_./+-]+$ ]]; then",
        '  lammps_input="$ck/portal-run.lmp"',
        '  lammps_checkpoint="$ck/portal-checkpoint.lmp"',
        '  latest=""',
        '  if [[ -s $ck/latest ]]; then read -r latest < "$ck/latest" || true; fi',
        # The mv below comes before the ledger names its result.
        "  if [[ ! -f $ck/$latest && -f $ck/restart.resume ]]; then latest=restart.resume; fi",
        "  if [[ $latest =~ ^restart\\.[a-z]+$ && -f $ck/$latest ]]; then",
        # Out of the way of this run's restart files, which LAMMPS writes over in place.
        '    if [[ $latest != restart.resume ]]; then mv -f -- "$ck/$latest" "$ck/restart.resume"; fi',
        "    printf 'restart.resume\\n' > \"$ck/latest\"",
        '    restart_from="$ck/restart.resume"',
        "    resume=1",
        "    printf 'PORTAL_RESUMED %(%s)T %s\\n' -1 \"$restart_from\"",
        "  fi",
        '  rm -f -- "$ck/restart.a" "$ck/restart.b" "$ck/restart.final"',
        '  cat > "$lammps_checkpoint" <<LAMMPS',
        *(line.format(seconds=seconds) for line in LAMMPS_CHECKPOINT),
        "LAMMPS",
        # The input's name is a RELPATH: nothing in it that the here-document or LAMMPS reads.
        '  cat > "$lammps_input" <<LAMMPS',
        *(line.format(input=values["input"]) for line in LAMMPS_DRIVER),
        "LAMMPS",
        "else",
        '  echo "LAMMPS cannot name $ck in its input: the job runs without checkpoints." >&2',
        "fi",
        "",
        *tracker_lines(
            newest=[
                'local file newest=""',
                "for file in restart.a restart.b restart.final; do",
                "  if [[ ! -f $ck/$file ]]; then continue; fi",
                "  if [[ -z $newest || $ck/$file -nt $ck/$newest ]]; then newest=$file; fi",
                "done",
                'echo "$newest"',
            ],
            done=['echo "PORTAL_CHECKPOINT $(stat -c %Y -- "$ck/$1") $1"'],
        ),
        "",
        *preempt_lines([': > "$ck/stop"  # fix halt stops the run at its next check']),
        *tracker_start_lines(),
        *launch_lines(f"{launcher} {' '.join(part for part in command if part)}", poll=True),
        *tracker_end_lines(),
        *exit_lines(),
    ]


GROMACS = JobTemplate(
    slug="gromacs",
    scenario=SCENARIO,
    name="GROMACS",
    description="GROMACS mdrun (gmx_mpi), one MPI rank per GPU with OMP_NUM_THREADS threads each; "
    "optionally builds the run input with grompp from .mdp, coordinates and topology first.",
    parameters_schema=schema(
        {
            "deffnm": relpath(
                "Run name",
                "Default file name of the run: mdrun reads <name>.tpr and writes "
                "<name>.log, .edr, .xtc, .cpt.",
                default="md",
            ),
            "mdp": relpath(
                "Run parameters (.mdp)",
                "Given with coordinates and topology, grompp builds "
                "<name>.tpr from them first; without it, <name>.tpr must exist.",
            ),
            "coordinates": relpath("Coordinates (.gro/.pdb)", "Starting structure for grompp."),
            "topology": relpath("Topology (.top)", "System topology for grompp."),
            "maxwarn": {
                "type": "integer",
                "title": "grompp warnings allowed",
                "minimum": 0,
                "maximum": 20,
                "default": 0,
                "description": "grompp -maxwarn.",
            },
            "nonbonded": {
                "type": "string",
                "title": "Non-bonded forces on",
                "enum": ["gpu", "cpu", "auto"],
                "default": "gpu",
                "description": "mdrun -nb.",
            },
            "pme": {
                "type": "string",
                "title": "PME on",
                "enum": ["gpu", "cpu", "auto"],
                "default": "auto",
                "description": "mdrun -pme.",
            },
            "nsteps": {
                "type": "integer",
                "title": "Steps",
                "minimum": -1,
                "maximum": 10**12,
                "description": "Steps to run, overriding the run input's nsteps (-1: no limit). Counted "
                "from where the run starts, a checkpoint included: for a fixed total, set nsteps "
                "in the .mdp instead.",
            },
            "resume": {
                "type": "boolean",
                "title": "Resume from checkpoint",
                "default": True,
                "description": "Continue from <name>.cpt when it exists (mdrun -cpi). A restarted attempt "
                "of this job continues from its own checkpoint whatever this says.",
            },
            "checkpoint_minutes": checkpoint_minutes(
                "Minutes between the checkpoints mdrun writes to the job's checkpoint directory (-cpt)."
            ),
        },
        dependentRequired={
            "mdp": ["coordinates", "topology"],
            "coordinates": ["mdp", "topology"],
            "topology": ["mdp", "coordinates"],
        },
    ),
    renderer=render_gromacs,
    multi_node_backends=frozenset({"slurm"}),
    vendors=MD_VENDORS,
)

LAMMPS = JobTemplate(
    slug="lammps",
    scenario=SCENARIO,
    name="LAMMPS",
    description="LAMMPS on its input script, one MPI rank per GPU by default, with the KOKKOS (or GPU) "
    "accelerator package.",
    parameters_schema=schema(
        {
            "input": relpath("Input script", "The LAMMPS input script (-in).", examples=["in.lj"]),
            "binary": {
                "type": "string",
                "title": "Executable",
                "enum": ["lmp", "lmp_mpi", "lmp_kokkos_cuda_mpi"],
                "default": "lmp",
                "description": "The LAMMPS executable's name on the cluster.",
            },
            "accelerator": {
                "type": "string",
                "title": "Accelerator package",
                "enum": list(ACCELERATOR_FLAGS),
                "default": "kokkos",
                "description": "kokkos: -k on g <GPUs per node> -sf kk; gpu: -sf gpu -pk gpu <GPUs per "
                "node>; opt: -sf opt (CPU); none: plain styles. The package must be built into "
                "the executable.",
            },
            "variables": {
                "type": "object",
                "title": "Variables",
                "description": "Index-style variables set with -var name value.",
                "propertyNames": {"pattern": VAR_NAME},
                # LAMMPS ends a -var value at the next argument that starts with '-', so a
                # negative number would be read as a new switch.
                "additionalProperties": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": WORD},
                "maxProperties": 32,
                "default": {},
            },
            "ranks_per_node": RANKS_PER_NODE,
            "checkpoint_minutes": checkpoint_minutes(
                "Minutes of wall-clock time between restart files, for an input script that includes "
                "${portal_checkpoint} once its box exists, reads ${portal_restart} when ${portal_resume} "
                "is 1, and runs with `run N upto`."
            ),
        },
        required=["input"],
    ),
    renderer=render_lammps,
    multi_node_backends=frozenset({"slurm"}),
    vendors=MD_VENDORS,
    checker=check_lammps,
)
