"""molecular-dynamics: GROMACS and LAMMPS, one MPI rank per GPU under srun (Slurm) or mpirun.

Both run on NVIDIA, AMD and Hygon GPUs with the same command lines: what differs is the build the
site installed (CUDA, or HIP/SYCL), not the switches. Neither has a build for Huawei Ascend or
Cambricon accelerators, so on those the templates refuse (field `gpu_model`) rather than run on
the CPU while the job is charged for NPUs or MLUs.
"""

from __future__ import annotations

from typing import Any

from .base import RANKS_PER_NODE, VAR_NAME, WORD, JobTemplate, Shape, header, mpi_launch, q, relpath, schema

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
    lines = header("gromacs", shape)
    if "mdp" in values:
        # grompp is serial and quick: it runs once here, in the batch step, before the ranks start.
        lines += [
            f"gmx_mpi grompp -f {q(values['mdp'])} -c {q(values['coordinates'])} -p {q(values['topology'])} "
            f"-o {q(deffnm + '.tpr')} -maxwarn {int(values['maxwarn'])}",
            "",
        ]
    setup, launcher = mpi_launch(shape, ranks_per_node=shape.gpus_per_node)
    mdrun = [
        f"gmx_mpi mdrun -deffnm {q(deffnm)} -ntomp {OMP_THREADS}",
        f"-nb {q(values['nonbonded'])}",
        f"-pme {q(values['pme'])}",
    ]
    if values["resume"]:
        # -cpi continues from <deffnm>.cpt when it exists (a preempted and requeued job) and
        # starts afresh when it does not.
        mdrun.append("-cpi")
    if "nsteps" in values:
        mdrun.append(f"-nsteps {int(values['nsteps'])}")
    return [*lines, *setup, f"exec {launcher} {' '.join(mdrun)}"]


ACCELERATOR_FLAGS = {
    "kokkos": lambda gpus: f"-k on g {gpus} -sf kk",
    "gpu": lambda gpus: f"-sf gpu -pk gpu {gpus}",
    "opt": lambda gpus: "-sf opt",
    "none": lambda gpus: "",
}


# Executables named for one device API: LAMMPS's `make kokkos_cuda_mpi` target builds for CUDA only.
BINARY_VENDORS = {"lmp_kokkos_cuda_mpi": frozenset({"nvidia"})}


def check_lammps(values: dict[str, Any], shape: Shape) -> dict[str, list[str]]:
    vendors = BINARY_VENDORS.get(values["binary"])
    if vendors is None or shape.vendor in vendors:
        return {}
    return {
        "parameters.binary": [
            f"{values['binary']} is LAMMPS's KOKKOS build for CUDA (NVIDIA GPUs). On this GPU model use "
            "lmp or lmp_mpi built with KOKKOS for HIP, or with the GPU package."
        ]
    }


def render_lammps(values: dict[str, Any], shape: Shape) -> list[str]:
    ranks_per_node = int(values.get("ranks_per_node", shape.gpus_per_node))
    setup, launcher = mpi_launch(shape, ranks_per_node=ranks_per_node)
    command = [
        q(values["binary"]),
        ACCELERATOR_FLAGS[values["accelerator"]](shape.gpus_per_node),
        f"-in {q(values['input'])}",
    ]
    command += [f"-var {q(name)} {q(value)}" for name, value in values["variables"].items()]
    return [*header("lammps", shape), *setup, f"exec {launcher} {' '.join(part for part in command if part)}"]


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
                "description": "Continue from <name>.cpt when it exists (mdrun -cpi).",
            },
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
        },
        required=["input"],
    ),
    renderer=render_lammps,
    multi_node_backends=frozenset({"slurm"}),
    vendors=MD_VENDORS,
    checker=check_lammps,
)
