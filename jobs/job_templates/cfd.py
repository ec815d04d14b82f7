"""cfd: OpenFOAM. Decompose the case, run the solver in parallel, reconstruct the last time.

The same on every vendor's partitions: OpenFOAM's solvers run on the CPUs, one MPI rank per core
or per GPU of the job, and read no accelerator variable, so the template renders no vendor's.

Checkpoints (the checkpoint contract, base.py) are the solver's own time directories. The
decomposed case, processor*/ with the mesh and every time the solver writes, lives in the
checkpoint directory, linked into the case, so that it outlasts the attempt's working directory;
the solver writes a time every checkpoint_minutes of wall-clock time (writeControl clockTime),
and on a preemption warning `stopAt writeNow` in system/controlDict, which the solver reads again
while it runs (runTimeModifiable), has it write the current time and stop. A later attempt starts
from the newest time known whole, without decomposing again.
"""

from __future__ import annotations

from typing import Any

from .base import (
    BASHRC,
    RANKS_PER_NODE,
    JobTemplate,
    Shape,
    checkpoint_lines,
    checkpoint_minutes,
    exit_lines,
    header,
    launch_lines,
    mpi_launch,
    preempt_lines,
    q,
    relpath,
    schema,
    source_lines,
    tracker_end_lines,
    tracker_lines,
    tracker_start_lines,
)

SCENARIO = "cfd"

# The transient and steady solvers that cover most cases; an allow-list, because the name
# becomes a command.
SOLVERS = [
    "simpleFoam",
    "pimpleFoam",
    "icoFoam",
    "pisoFoam",
    "rhoPimpleFoam",
    "rhoSimpleFoam",
    "interFoam",
    "buoyantSimpleFoam",
    "buoyantPimpleFoam",
]


# The generated decomposeParDict's method. scotch balances any mesh without hints, but some
# builds (Debian's openfoam package) ship only its stub; simple cuts N slabs along x, which every
# build has and which suits small or box-shaped meshes.
METHODS = {
    "scotch": lambda ranks: ["method scotch;"],
    "simple": lambda ranks: ["method simple;", f"simpleCoeffs {{ n ({ranks} 1 1); delta 0.001; }}"],
}


def _set(entry: str, value: str) -> str:
    return f"foamDictionary -entry {entry} -set {value} system/controlDict"


def render_openfoam(values: dict[str, Any], shape: Shape) -> list[str]:
    ranks_per_node = int(values.get("ranks_per_node", shape.gpus_per_node))
    ranks = shape.nodes * ranks_per_node
    lines = header("openfoam", shape)
    if "bashrc" in values:
        lines += source_lines(values["bashrc"], "OpenFOAM environment")
    if values["case_dir"] != ".":
        lines += [f"cd -- {q(values['case_dir'])}", ""]
    # Indented inside the `if` below, but for the here-document, whose end must start its line.
    decompose = ["  blockMesh"] if values["block_mesh"] else []
    decompose += [
        # The mesh must be split into exactly as many parts as there are ranks. A case's own
        # decomposeParDict keeps its method and gets the count; a case without one gets one.
        "  if [[ -f system/decomposeParDict ]]; then",
        f"    foamDictionary -entry numberOfSubdomains -set {ranks} system/decomposeParDict",
        "  else",
        "    cat > system/decomposeParDict <<'DICT'",
        "FoamFile { version 2.0; format ascii; class dictionary; object decomposeParDict; }",
        f"numberOfSubdomains {ranks};",
        *METHODS[values["decompose_method"]](ranks),
        "DICT",
        "  fi",
        "  decomposePar -force",
        '  rm -rf -- "$ck"/processor*',
        '  for dir in processor*; do mv -- "$dir" "$ck/"; done',
    ]
    setup, launcher = mpi_launch(shape, ranks_per_node=ranks_per_node)
    return [
        *lines,
        *checkpoint_lines(values),
        "ck=$PORTAL_CHECKPOINT_DIR",
        # The solver reads controlDict again at its next time step and writes that time before it
        # stops (stopAt writeNow: https://doc.cfd.direct/openfoam/user-guide-v11/controldict).
        # Before the solver starts, the warning stops the job there (launch_lines).
        *preempt_lines(
            [
                "if [[ -n $app ]]; then",
                f'  {_set("stopAt", "writeNow")} || echo "The solver could not be told to stop." >&2',
                "fi",
            ]
        ),
        "shopt -s nullglob",
        # The case's own controlDict, kept the first time: each attempt starts from it, and the job
        # leaves it as it found it, whatever an earlier attempt's stop request left behind.
        "if [[ -f $ck/controlDict ]]; then",
        '  cp -p -- "$ck/controlDict" system/controlDict',
        "else",
        '  cp -p -- system/controlDict "$ck/controlDict"',
        "fi",
        # The newest time directory known whole (the ledger, base.tracker_lines): latestTime could
        # pick one that a failed node left half written.
        'resume_time=""',
        'if [[ -s $ck/latest ]]; then read -r resume_time < "$ck/latest" || true; fi',
        "if [[ ! $resume_time =~ ^[0-9.eE+-]+$ || ! -d $ck/processor0/$resume_time ]]; then",
        '  resume_time=""',
        "fi",
        # The case's processor* are links into the checkpoint directory, or an earlier run's: gone
        # before decomposePar -force, which would delete through a link.
        'for dir in processor*; do rm -rf -- "$dir"; done',
        "if [[ -z $resume_time ]]; then",
        *decompose,
        "else",
        f"  {_set('startFrom', 'startTime')}",
        f"  {_set('startTime', chr(34) + '$resume_time' + chr(34))}",
        "  printf 'PORTAL_RESUMED %(%s)T time %s\\n' -1 \"$resume_time\"",
        "fi",
        'for dir in "$ck"/processor*; do ln -s -- "$dir" "${dir##*/}"; done',
        # Time directories every checkpoint_minutes of wall-clock time (controlDict, writeControl
        # clockTime: https://doc.cfd.direct/openfoam/user-guide-v11/controldict).
        _set("writeControl", "clockTime"),
        _set("writeInterval", str(60 * int(values["checkpoint_minutes"]))),
        _set("runTimeModifiable", "true"),
        "",
        *tracker_lines(
            newest=[
                'local dir newest=""',
                'for dir in "$ck"/processor0/*/; do',
                "  dir=${dir%/}",
                "  if [[ ! ${dir##*/} =~ ^[0-9.eE+-]+$ ]]; then continue; fi",
                "  if [[ -z $newest || $dir -nt $newest ]]; then newest=$dir; fi",
                "done",
                'echo "${newest##*/}"',
            ],
            done=['echo "PORTAL_CHECKPOINT $(stat -c %Y -- "$ck/processor0/$1") time $1"'],
        ),
        "",
        *setup,
        *tracker_start_lines(),
        # Warned already: the case's controlDict back before the job stops (launch_lines).
        'if (( preempted )); then cp -p -- "$ck/controlDict" system/controlDict; fi',
        *launch_lines(f"{launcher} {q(values['solver'])} -parallel", poll=True),
        *tracker_end_lines(),
        'cp -p -- "$ck/controlDict" system/controlDict',
        "if (( preempted || status != 0 )); then",
        *(f"  {line}" for line in exit_lines()),
        "fi",
        "",
        "reconstructPar -latestTime",
    ]


OPENFOAM = JobTemplate(
    slug="openfoam",
    scenario=SCENARIO,
    name="OpenFOAM",
    description="An OpenFOAM case run in parallel: decomposePar into one part per MPI rank, the solver "
    "under srun (Slurm) or mpirun, then reconstructPar of the latest time.",
    parameters_schema=schema(
        {
            "case_dir": relpath(
                "Case directory",
                "The case (with constant/, system/, 0/), relative to the working directory.",
                default=".",
            ),
            "solver": {"type": "string", "title": "Solver", "enum": SOLVERS, "default": "simpleFoam"},
            "bashrc": {
                "type": "string",
                "title": "OpenFOAM environment",
                "maxLength": 255,
                "pattern": BASHRC,
                "description": "The installation's etc/bashrc, sourced first; leave out when the "
                "environment is already set (a module, a container image).",
                "examples": ["/usr/lib/openfoam/openfoam2312/etc/bashrc", "/opt/openfoam11/etc/bashrc"],
            },
            "block_mesh": {
                "type": "boolean",
                "title": "Run blockMesh",
                "default": False,
                "description": "Build the mesh from system/blockMeshDict before decomposing.",
            },
            "decompose_method": {
                "type": "string",
                "title": "Decomposition method",
                "enum": list(METHODS),
                "default": "scotch",
                "description": "For a case without system/decomposeParDict: scotch, or simple (slabs "
                "along x) where the build lacks scotch. A case's own dict keeps its method.",
            },
            "ranks_per_node": RANKS_PER_NODE,
            "checkpoint_minutes": checkpoint_minutes(
                "Minutes of wall-clock time between the time directories the solver writes (controlDict "
                "writeControl clockTime; it replaces the case's own writeControl and writeInterval)."
            ),
        },
    ),
    renderer=render_openfoam,
    multi_node_backends=frozenset({"slurm"}),
)
