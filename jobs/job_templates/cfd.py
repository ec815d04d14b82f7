"""cfd: OpenFOAM. Decompose the case, run the solver in parallel, reconstruct the last time.

The same on every vendor's partitions: OpenFOAM's solvers run on the CPUs, one MPI rank per core
or per GPU of the job, and read no accelerator variable, so the template renders no vendor's.
"""

from __future__ import annotations

from typing import Any

from .base import (
    BASHRC,
    RANKS_PER_NODE,
    JobTemplate,
    Shape,
    header,
    mpi_launch,
    q,
    relpath,
    schema,
    source_lines,
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


def render_openfoam(values: dict[str, Any], shape: Shape) -> list[str]:
    ranks_per_node = int(values.get("ranks_per_node", shape.gpus_per_node))
    ranks = shape.nodes * ranks_per_node
    lines = header("openfoam", shape)
    if "bashrc" in values:
        lines += source_lines(values["bashrc"], "OpenFOAM environment")
    if values["case_dir"] != ".":
        lines += [f"cd -- {q(values['case_dir'])}", ""]
    if values["block_mesh"]:
        lines += ["blockMesh", ""]
    setup, launcher = mpi_launch(shape, ranks_per_node=ranks_per_node)
    return [
        *lines,
        # The mesh must be split into exactly as many parts as there are ranks. A case's own
        # decomposeParDict keeps its method and gets the count; a case without one gets one.
        "if [[ -f system/decomposeParDict ]]; then",
        f"  foamDictionary -entry numberOfSubdomains -set {ranks} system/decomposeParDict",
        "else",
        "  cat > system/decomposeParDict <<'DICT'",
        "FoamFile { version 2.0; format ascii; class dictionary; object decomposeParDict; }",
        f"numberOfSubdomains {ranks};",
        *METHODS[values["decompose_method"]](ranks),
        "DICT",
        "fi",
        "decomposePar -force",
        "",
        *setup,
        f"{launcher} {q(values['solver'])} -parallel",
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
        },
    ),
    renderer=render_openfoam,
    multi_node_backends=frozenset({"slurm"}),
)
