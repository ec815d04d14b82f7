"""Sizing advisor: from what a researcher knows about a job to GPUs, nodes and GPU-hours per
GPU model, in the scenario's rank order.

Pure functions on plain data: no request, no database. The estimates are rough on purpose; what
matters is the order of magnitude and arithmetic a researcher can check, so every option carries
its steps as text and every answer states its assumptions. A model that cannot hold the job in
memory even at `max_gpus` (or has no units for the asked precision) is left out of the options
and named, with the reason, in the assumptions.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

GPUS_PER_NODE = 8
MAX_GPUS = 256
# CUDA/ROCm context, allocator fragmentation and communication buffers take the rest.
USABLE_MEMORY = 0.9
# NVLink-class links; below this, sharded training waits on gradient and parameter traffic.
FAST_LINK_GBS = 300


class GpuFigures(Protocol):
    slug: str
    name: str
    memory_gb: int
    fp64_tflops: float
    fp32_tflops: float
    fp16_tflops: float
    memory_bandwidth_gbs: int
    interconnect_gbs: int


@dataclass(frozen=True)
class Option:
    gpu_model: str
    gpus: int
    nodes: int
    gpu_hours: float
    arithmetic: list[str]


@dataclass(frozen=True)
class Advice:
    assumptions: list[str]
    options: list[Option]


@dataclass(frozen=True)
class AiJob:
    params_b: float
    precision: str = "bf16"
    method: str = "full"
    tokens_b: float | None = None
    target_days: float = 7.0
    gpus_per_node: int = GPUS_PER_NODE
    max_gpus: int = MAX_GPUS


@dataclass(frozen=True)
class MdJob:
    atoms: int
    ns_per_day: float
    simulated_ns: float | None = None
    days: float | None = None
    timestep_fs: float = 2.0
    gpus_per_node: int = GPUS_PER_NODE
    max_gpus: int = MAX_GPUS


@dataclass(frozen=True)
class CfdJob:
    cells_m: float
    iterations: int
    precision: str = "fp64"
    target_days: float = 1.0
    gpus_per_node: int = GPUS_PER_NODE
    max_gpus: int = MAX_GPUS


def _n(x: float) -> str:
    """A figure as a reader wants it: thousands separated, three significant digits below 100."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _nodes(gpus: int, per_node: int) -> int:
    return math.ceil(gpus / per_node)


def _memory_gpus(need_gb: float, gpu: GpuFigures, lines: list[str]) -> int:
    usable = gpu.memory_gb * USABLE_MEMORY
    count = max(1, math.ceil(need_gb / usable))
    lines.append(
        f"Usable memory per GPU: 90 % of {gpu.memory_gb} GB = {_n(usable)} GB → "
        f"⌈{_n(need_gb)} / {_n(usable)}⌉ = {count} GPU(s) to hold the job"
    )
    return count


def _too_big(gpu: GpuFigures, count: int, need_gb: float, max_gpus: int) -> str:
    return (
        f"{gpu.name} needs {count} GPUs of {gpu.memory_gb} GB for {_n(need_gb)} GB, over max_gpus={max_gpus}"
    )


def _advise(
    gpus: Sequence[GpuFigures], size: Callable[[GpuFigures], Option | str], assumptions: list[str]
) -> Advice:
    options, left_out = [], []
    for gpu in gpus:
        sized = size(gpu)
        if isinstance(sized, str):
            left_out.append(sized)
        else:
            options.append(sized)
    if left_out:
        assumptions.append("Left out (cannot run this job): " + "; ".join(left_out) + ".")
    return Advice(assumptions=assumptions, options=options)


# --- AI training -------------------------------------------------------------------------------

DEFAULT_TOKENS_B = 1.0
ACTIVATION_OVERHEAD = 0.2
MFU_FAST = 0.40
MFU_PCIE = 0.25
LORA_TRAINABLE = 0.01
# Bytes per parameter of a full fine-tune with Adam: (weights, gradients, optimizer). Mixed
# precision keeps an FP32 master copy and two FP32 moments: 4 + 4 + 4 = 12 optimizer bytes.
FULL_BYTES = {"bf16": (2, 2, 12), "fp16": (2, 2, 12), "fp8": (2, 2, 12), "fp32": (4, 4, 8)}
WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


def _ai_state_gb(job: AiJob, params: float) -> tuple[float, str]:
    if job.method == "lora":
        base = WEIGHT_BYTES[job.precision] * params / 1e9
        adapters = 16 * LORA_TRAINABLE * params / 1e9
        return base + adapters, (
            f"LoRA: frozen weights {WEIGHT_BYTES[job.precision]} bytes/parameter × {job.params_b:g}e9 = "
            f"{_n(base)} GB; adapters 1 % of the parameters × 16 bytes (mixed-precision Adam) = "
            f"{_n(adapters)} GB; states {_n(base + adapters)} GB"
        )
    weights, grads, optimizer = FULL_BYTES[job.precision]
    per_param = weights + grads + optimizer
    kind = "FP32 Adam" if job.precision == "fp32" else "mixed-precision Adam"
    state = per_param * params / 1e9
    return state, (
        f"{per_param} bytes/parameter for {kind} ({weights} weights + {grads} grads + {optimizer} optimizer)"
        f" × {job.params_b:g}e9 = {_n(state)} GB"
    )


def advise_ai(job: AiJob, gpus: Sequence[GpuFigures]) -> Advice:
    """GPUs to hold a model's training states and finish its tokens within the target days."""
    params = job.params_b * 1e9
    tokens_b = job.tokens_b if job.tokens_b is not None else DEFAULT_TOKENS_B
    flops_per_token = 6 if job.method == "full" else 4
    flops = flops_per_token * params * tokens_b * 1e9
    state_gb, state_line = _ai_state_gb(job, params)
    need_gb = state_gb * (1 + ACTIVATION_OVERHEAD)
    target_h = job.target_days * 24
    fp32 = job.precision == "fp32"
    assumptions = [
        f"Training tokens: {tokens_b:g}e9"
        + (
            " (none given: a typical fine-tuning run; pre-training from scratch wants ≈ 20 tokens per "
            "parameter)."
            if job.tokens_b is None
            else "."
        ),
        "Memory: model and optimizer states sharded over all GPUs (ZeRO-3/FSDP), plus 20 % for "
        "activations (with checkpointing) and buffers; 90 % of each GPU's memory usable.",
        "Compute: 6·N·T FLOP for full training (forward 2, backward 4), 4·N·T for LoRA (no weight "
        "gradients for the frozen base); attention FLOPs not counted.",
        f"Throughput: {MFU_FAST * 100:.0f} % model-FLOPs utilisation (MFU) of the dense peak; "
        f"{MFU_PCIE * 100:.0f} % when more than one GPU shares PCIe-class links (< {FAST_LINK_GBS} GB/s). "
        "GPU-hours do not grow with the GPU count (the MFU already pays for communication).",
        f"Nodes of {job.gpus_per_node} GPUs; a multi-node job takes whole nodes; at most "
        f"{job.max_gpus} GPUs; target {job.target_days:g} day(s).",
    ]
    if job.precision == "fp8":
        assumptions.append(
            "FP8: states as in BF16 mixed precision (master weights and Adam stay FP32); throughput "
            "counted at the BF16 peak, since the FP8 speed-up depends on kernels and model."
        )
    if job.method == "lora":
        assumptions.append("LoRA: adapters ≈ 1 % of the parameters (rank 16 on every linear layer).")

    def size(gpu: GpuFigures) -> Option | str:
        peak = gpu.fp32_tflops if fp32 else gpu.fp16_tflops
        if not peak:
            return f"{gpu.name} has no {'FP32' if fp32 else 'FP16/BF16'} rate on record"
        lines = [state_line, f"+ 20 % for activations and buffers = {_n(need_gb)} GB"]
        mem = _memory_gpus(need_gb, gpu, lines)
        if mem > job.max_gpus:
            return _too_big(gpu, mem, need_gb, job.max_gpus)
        lines.append(
            f"Compute: {flops_per_token} × {job.params_b:g}e9 parameters × {tokens_b:g}e9 tokens "
            f"= {flops:.2e} FLOP"
        )
        mfu = MFU_FAST
        hours = flops / (peak * 1e12 * mfu) / 3600
        count = max(mem, math.ceil(hours / target_h))
        if count > 1 and gpu.interconnect_gbs < FAST_LINK_GBS:
            mfu = MFU_PCIE
            hours = flops / (peak * 1e12 * mfu) / 3600
        label = "FP32" if fp32 else "FP16/BF16"
        lines.append(
            f"At {mfu * 100:.0f} % MFU of {_n(peak)} TFLOP/s dense {label} = {_n(peak * mfu)} TFLOP/s "
            f"per GPU: {flops:.2e} / {peak * mfu:.3g}e12 / 3600 = {_n(hours)} GPU-hours"
        )
        time_gpus = math.ceil(hours / target_h)
        lines.append(
            f"Target {job.target_days:g} day(s) = {_n(target_h)} h: ⌈{_n(hours)} / {_n(target_h)}⌉ "
            f"= {time_gpus} GPU(s)"
        )
        count = max(mem, time_gpus)
        if count > job.gpus_per_node:
            whole = _nodes(count, job.gpus_per_node) * job.gpus_per_node
            lines.append(
                f"max({mem}, {time_gpus}) = {count}, in whole nodes of {job.gpus_per_node}: {whole} GPUs"
            )
            count = whole
        if count > job.max_gpus:
            lines.append(f"Capped at max_gpus = {job.max_gpus}")
            count = job.max_gpus
        wall_h = hours / count
        late = f", beyond the {job.target_days:g}-day target" if wall_h > target_h * 1.0001 else ""
        lines.append(f"Wall time ≈ {_n(hours)} / {count} = {_n(wall_h)} h ({_n(wall_h / 24)} days{late})")
        return Option(gpu.slug, count, _nodes(count, job.gpus_per_node), round(hours, 2), lines)

    return _advise(gpus, size, assumptions)


# --- Molecular dynamics ------------------------------------------------------------------------

# atom·ns/day per throughput-index point per fs of time step: one A100 (index 199) then runs a
# 1.07 M-atom STMV-size system at ≈ 50 ns/day with a 4 fs step, the order of public AMBER 22 and
# GROMACS benchmark figures.
MD_CALIBRATION = 67_000
MD_LATENCY_ATOMS = 50_000
MD_ATOMS_PER_GPU = 25_000
MD_KEPT_PER_DOUBLING = 0.8
MD_BYTES_PER_ATOM = 1_000


def _md_speedup(gpus: int) -> float:
    return gpus * MD_KEPT_PER_DOUBLING ** math.log2(gpus)


def advise_md(job: MdJob, gpus: Sequence[GpuFigures]) -> Advice:
    """GPUs to reach the wanted ns/day, and GPU-hours for the whole simulated length."""
    simulated_ns = job.simulated_ns if job.simulated_ns is not None else job.ns_per_day * (job.days or 0)
    effective_atoms = max(job.atoms, MD_LATENCY_ATOMS)
    need_gb = job.atoms * MD_BYTES_PER_ATOM / 1e9
    useful = max(1, job.atoms // MD_ATOMS_PER_GPU)
    assumptions = [
        f"Simulated length: {_n(simulated_ns)} ns"
        + (f" ({job.days:g} days at {job.ns_per_day:g} ns/day)." if job.simulated_ns is None else "."),
        f"Throughput of one GPU: {MD_CALIBRATION:,} × time step (fs) × √(FP32 TFLOP/s × memory GB/s) ÷ "
        "atoms, in ns/day; calibrated so one A100 runs a ≈ 1 M-atom PME system (STMV size) at ≈ 50 ns/day "
        "with a 4 fs step, the order of public AMBER/GROMACS benchmarks. Measure your own system before "
        "a large request.",
        f"Below {MD_LATENCY_ATOMS:,} atoms a GPU is latency-bound: throughput stops growing as the "
        "system shrinks.",
        f"Scaling over MPI: each doubling of GPUs keeps {MD_KEPT_PER_DOUBLING * 100:.0f} % efficiency "
        "(domain "
        f"decomposition, PME all-to-all); no more than one GPU per {MD_ATOMS_PER_GPU:,} atoms.",
        f"Memory: ≈ 1 kB per atom; 90 % of each GPU's memory usable. Time step {job.timestep_fs:g} fs; "
        f"nodes of {job.gpus_per_node} GPUs; at most {job.max_gpus} GPUs.",
    ]

    def size(gpu: GpuFigures) -> Option | str:
        index = math.sqrt(gpu.fp32_tflops * gpu.memory_bandwidth_gbs)
        if not index:
            return f"{gpu.name} has no FP32 rate on record"
        one = MD_CALIBRATION * job.timestep_fs * index / effective_atoms
        lines = [
            f"Memory: {job.atoms:,} atoms × 1 kB = {_n(need_gb)} GB",
        ]
        mem = _memory_gpus(need_gb, gpu, lines)
        if mem > job.max_gpus:
            return _too_big(gpu, mem, need_gb, job.max_gpus)
        lines += [
            f"Throughput index √({_n(gpu.fp32_tflops)} TFLOP/s FP32 × {gpu.memory_bandwidth_gbs} GB/s) "
            f"= {_n(index)}",
            f"One GPU: {MD_CALIBRATION:,} × {job.timestep_fs:g} fs × {_n(index)} ÷ {effective_atoms:,} atoms "
            f"= {_n(one)} ns/day",
        ]
        top = min(max(useful, mem), job.max_gpus)
        count = next((n for n in range(mem, top + 1) if one * _md_speedup(n) >= job.ns_per_day), top)
        rate = one * _md_speedup(count)
        if count > 1:
            lines.append(
                f"{count} GPUs: speed-up {count} × 0.8^log2({count}) = {_md_speedup(count):.2f} "
                f"→ {_n(rate)} ns/day"
            )
        if rate < job.ns_per_day:
            lines.append(
                f"Short of the {job.ns_per_day:g} ns/day asked: more GPUs than {count} exceed max_gpus or "
                f"leave fewer than {MD_ATOMS_PER_GPU:,} atoms per GPU"
            )
        wall_days = simulated_ns / rate
        gpu_hours = count * wall_days * 24
        lines.append(
            f"{_n(simulated_ns)} ns ÷ {_n(rate)} ns/day = {_n(wall_days)} days × 24 h × {count} GPU(s) "
            f"= {_n(gpu_hours)} GPU-hours"
        )
        return Option(gpu.slug, count, _nodes(count, job.gpus_per_node), round(gpu_hours, 2), lines)

    return _advise(gpus, size, assumptions)


# --- CFD and FEA -------------------------------------------------------------------------------

# One outer iteration of a pressure-based implicit solver (or one explicit step), per cell:
# tens of sparse multigrid sweeps at about 1 FLOP per byte. An order of magnitude, set so that a
# V100-class GPU takes ≈ 0.1-0.2 µs per cell-iteration, i.e. does the work of a few dozen cores.
CFD_BYTES_PER_CELL = 100_000
CFD_FLOP_PER_CELL = 100_000
CFD_MIXED_BYTES = 0.6
CFD_BANDWIDTH_EFFICIENCY = 0.7
CFD_FLOP_EFFICIENCY = 0.5
CFD_GB_PER_MCELL = {"fp64": 2.0, "mixed": 1.2}
CFD_MIN_MCELLS_PER_GPU = 1.0
CFD_PARALLEL_EFFICIENCY = 0.9


def advise_cfd(job: CfdJob, gpus: Sequence[GpuFigures]) -> Advice:
    """GPUs to hold the mesh and finish its iterations within the target days (roofline)."""
    fp64 = job.precision == "fp64"
    per_cell_bytes = CFD_BYTES_PER_CELL * (1 if fp64 else CFD_MIXED_BYTES)
    need_gb = job.cells_m * CFD_GB_PER_MCELL[job.precision]
    cell_iterations = job.cells_m * 1e6 * job.iterations
    useful = max(1, math.floor(job.cells_m / CFD_MIN_MCELLS_PER_GPU))
    target_h = job.target_days * 24
    assumptions = [
        f"Work per cell and iteration (one implicit outer iteration or explicit step, linear-solver "
        f"sweeps included): {CFD_BYTES_PER_CELL:,} bytes of memory traffic and {CFD_FLOP_PER_CELL:,} FLOP in "
        "FP64; mixed precision moves 40 % fewer bytes and runs at the FP32 rate. An order of magnitude: "
        "time 100 iterations of your case to calibrate.",
        "Roofline: time = max(bytes ÷ 70 % of memory bandwidth, FLOP ÷ 50 % of peak).",
        f"Memory: {CFD_GB_PER_MCELL['fp64']:g} GB per million cells in FP64, "
        f"{CFD_GB_PER_MCELL['mixed']:g} GB "
        "mixed (mesh, fields, matrix, multigrid); 90 % of each GPU's memory usable.",
        f"Decomposition: at least {CFD_MIN_MCELLS_PER_GPU:g} M cells per GPU; "
        f"{CFD_PARALLEL_EFFICIENCY * 100:.0f} % "
        f"parallel efficiency on more than one GPU. Target {job.target_days:g} day(s); nodes of "
        f"{job.gpus_per_node} GPUs; at most {job.max_gpus} GPUs.",
    ]

    def size(gpu: GpuFigures) -> Option | str:
        peak = gpu.fp64_tflops if fp64 else gpu.fp32_tflops
        label = "FP64" if fp64 else "FP32"
        if not peak:
            return f"{gpu.name} has no {label} units"
        lines = [
            f"Memory: {job.cells_m:g} M cells × {CFD_GB_PER_MCELL[job.precision]:g} GB = {_n(need_gb)} GB"
        ]
        mem = _memory_gpus(need_gb, gpu, lines)
        if mem > job.max_gpus:
            return _too_big(gpu, mem, need_gb, job.max_gpus)
        t_bytes = per_cell_bytes / (CFD_BANDWIDTH_EFFICIENCY * gpu.memory_bandwidth_gbs * 1e9)
        t_flop = CFD_FLOP_PER_CELL / (CFD_FLOP_EFFICIENCY * peak * 1e12)
        per_cell = max(t_bytes, t_flop)
        bound = "bandwidth" if t_bytes >= t_flop else "compute"
        lines.append(
            f"Per cell-iteration: {per_cell_bytes:,.0f} bytes ÷ 70 % of {gpu.memory_bandwidth_gbs} GB/s = "
            f"{t_bytes * 1e9:.3g} ns; {CFD_FLOP_PER_CELL:,} FLOP ÷ 50 % of {_n(peak)} TFLOP/s {label} = "
            f"{t_flop * 1e9:.3g} ns → {bound}-bound, {per_cell * 1e9:.3g} ns"
        )
        one_gpu_h = cell_iterations * per_cell / 3600
        lines.append(
            f"{job.cells_m:g}e6 cells × {job.iterations:,} iterations × {per_cell * 1e9:.3g} ns = "
            f"{_n(one_gpu_h)} hours on one GPU"
        )
        time_gpus = (
            1 if one_gpu_h <= target_h else math.ceil(one_gpu_h / (CFD_PARALLEL_EFFICIENCY * target_h))
        )
        count = min(max(mem, min(time_gpus, useful)), job.max_gpus)
        if time_gpus > 1:
            lines.append(
                f"Target {_n(target_h)} h: ⌈{_n(one_gpu_h)} / (90 % × {_n(target_h)})⌉ = {time_gpus} GPUs; "
                f"useful up to {useful} ({CFD_MIN_MCELLS_PER_GPU:g} M cells each) → {count}"
            )
        gpu_hours = one_gpu_h / (CFD_PARALLEL_EFFICIENCY if count > 1 else 1)
        wall_h = gpu_hours / count
        late = f", beyond the {job.target_days:g}-day target" if wall_h > target_h * 1.0001 else ""
        lines.append(f"{count} GPU(s): {_n(gpu_hours)} GPU-hours, wall time ≈ {_n(wall_h)} h{late}")
        return Option(gpu.slug, count, _nodes(count, job.gpus_per_node), round(gpu_hours, 2), lines)

    return _advise(gpus, size, assumptions)


ADVISORS = {"ai": advise_ai, "md": advise_md, "cfd": advise_cfd}


def advise(*, advisor: str, job: AiJob | MdJob | CfdJob, gpus: Sequence[GpuFigures]) -> Advice:
    """Advice from the named advisor (Scenario.advisor) over `gpus`, given in rank order."""
    return ADVISORS[advisor](job, gpus)
