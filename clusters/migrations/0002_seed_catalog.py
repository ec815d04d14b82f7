"""Seed the GPU catalog and the three built-in scenarios, with each scenario's ranking computed
from the figures by the rule written next to it (so a corrected figure re-ranks on a re-seed).

Figures are the vendors' public datasheet values, dense (no structured sparsity). Where a
datasheet omits a figure it is derived, and the comment says how. `fp64_tflops` is the vector
(non-tensor) rate: the sparse and stencil kernels of CFD/FEA solvers don't run on DGEMM tensor
cores. `interconnect_gbs` is GPU-to-GPU bandwidth, both directions together, as vendors quote it.

`cost_index` is the rough price of one GPU-hour relative to H100-80GB = 100, from public
on-demand cloud prices of 2024/25 (they vary by 2x between providers; only the ratio is meant).
The Cambricon and Hygon parts have no public cloud price: their index is an estimate from the
tier they compete in, and says so. Admins should correct it to their own cost.
"""

import math

from django.db import migrations

# The AI rule's thresholds: at 80 GB a GPU holds the states of a ~4B-parameter full fine-tune
# (16 bytes/parameter) or a 30B LoRA, so most jobs need little sharding; 300 GB/s separates
# NVLink-class links from PCIe-class ones, on which sharded training waits for traffic.
AI_MEMORY_GB = 80
FAST_LINK_GBS = 300

GPU_MODELS = [
    # NVIDIA H200 Tensor Core GPU datasheet (H200 SXM).
    dict(slug="h200", vendor="nvidia", name="H200", memory_gb=141, fp64_tflops=34, fp32_tflops=67,
         fp16_tflops=989, memory_bandwidth_gbs=4800, interconnect="NVLink 4 (900 GB/s)",
         interconnect_gbs=900, ecc=True, cost_index=125, slurm_gres="h200",
         k8s_resource="nvidia.com/gpu", k8s_product="NVIDIA-H200"),
    # NVIDIA H100 Tensor Core GPU datasheet (H100 SXM5).
    dict(slug="h100-80gb", vendor="nvidia", name="H100-80GB", memory_gb=80, fp64_tflops=34, fp32_tflops=67,
         fp16_tflops=989, memory_bandwidth_gbs=3350, interconnect="NVLink 4 (900 GB/s)",
         interconnect_gbs=900, ecc=True, cost_index=100, slurm_gres="h100",
         k8s_resource="nvidia.com/gpu", k8s_product="NVIDIA-H100-80GB-HBM3"),
    # NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM).
    dict(slug="a100-80gb", vendor="nvidia", name="A100-80GB", memory_gb=80, fp64_tflops=9.7, fp32_tflops=19.5,
         fp16_tflops=312, memory_bandwidth_gbs=2039, interconnect="NVLink 3 (600 GB/s)",
         interconnect_gbs=600, ecc=True, cost_index=55, slurm_gres="a100",
         k8s_resource="nvidia.com/gpu", k8s_product="NVIDIA-A100-SXM4-80GB"),
    # NVIDIA A100 Tensor Core GPU datasheet (A100 40GB SXM).
    dict(slug="a100-40gb", vendor="nvidia", name="A100-40GB", memory_gb=40, fp64_tflops=9.7, fp32_tflops=19.5,
         fp16_tflops=312, memory_bandwidth_gbs=1555, interconnect="NVLink 3 (600 GB/s)",
         interconnect_gbs=600, ecc=True, cost_index=45, slurm_gres="a100-40gb",
         k8s_resource="nvidia.com/gpu", k8s_product="NVIDIA-A100-SXM4-40GB"),
    # NVIDIA L40S datasheet. FP64 not listed: 1/64 of FP32 (Ada AD102 rate).
    dict(slug="l40s", vendor="nvidia", name="L40S", memory_gb=48, fp64_tflops=1.43, fp32_tflops=91.6,
         fp16_tflops=362, memory_bandwidth_gbs=864, interconnect="PCIe 4.0 x16 (64 GB/s)",
         interconnect_gbs=64, ecc=True, cost_index=40, slurm_gres="l40s",
         k8s_resource="nvidia.com/gpu", k8s_product="NVIDIA-L40S"),
    # NVIDIA A40 datasheet. FP64 not listed: 1/64 of FP32 (Ampere GA102 rate). The NVLink bridge
    # pairs only two cards, so an 8-GPU node talks over PCIe.
    dict(slug="a40", vendor="nvidia", name="A40", memory_gb=48, fp64_tflops=0.58, fp32_tflops=37.4,
         fp16_tflops=149.7, memory_bandwidth_gbs=696, interconnect="PCIe 4.0 x16; NVLink bridge pairs 2",
         interconnect_gbs=64, ecc=True, cost_index=30, slurm_gres="a40",
         k8s_resource="nvidia.com/gpu", k8s_product="NVIDIA-A40"),
    # NVIDIA A10 Tensor Core GPU datasheet. FP64 not listed: 1/64 of FP32 (GA102 rate).
    dict(slug="a10", vendor="nvidia", name="A10", memory_gb=24, fp64_tflops=0.49, fp32_tflops=31.2,
         fp16_tflops=125, memory_bandwidth_gbs=600, interconnect="PCIe 4.0 x16 (64 GB/s)",
         interconnect_gbs=64, ecc=True, cost_index=25, slurm_gres="a10",
         k8s_resource="nvidia.com/gpu", k8s_product="NVIDIA-A10"),
    # NVIDIA T4 Tensor Core GPU datasheet. FP64 not listed: 1/32 of FP32 (Turing TU104 rate).
    dict(slug="t4", vendor="nvidia", name="T4", memory_gb=16, fp64_tflops=0.25, fp32_tflops=8.1,
         fp16_tflops=65, memory_bandwidth_gbs=320, interconnect="PCIe 3.0 x16 (32 GB/s)",
         interconnect_gbs=32, ecc=True, cost_index=12, slurm_gres="t4",
         k8s_resource="nvidia.com/gpu", k8s_product="Tesla-T4"),
    # NVIDIA V100 Tensor Core GPU datasheet (V100S PCIe column).
    dict(slug="v100s", vendor="nvidia", name="V100S", memory_gb=32, fp64_tflops=8.2, fp32_tflops=16.4,
         fp16_tflops=130, memory_bandwidth_gbs=1134, interconnect="PCIe 3.0 x16 (32 GB/s)",
         interconnect_gbs=32, ecc=True, cost_index=20, slurm_gres="v100s",
         k8s_resource="nvidia.com/gpu", k8s_product="Tesla-V100S-PCIE-32GB"),
    # AMD Instinct MI250X accelerator datasheet (OAM: 128 GB, 3.2 TB/s, 47.9 FP64 vector, 383
    # FP16 matrix, 8 Infinity Fabric links at 100 GB/s). Halved here: ROCm, Slurm and the
    # amd.com/gpu device plugin each schedule one of its two GCDs as "a GPU", and every count
    # in this portal (quota, advisor) is in scheduler GPUs.
    dict(slug="mi250x", vendor="amd", name="MI250X (one GCD)", memory_gb=64, fp64_tflops=23.9,
         fp32_tflops=23.9, fp16_tflops=191.5, memory_bandwidth_gbs=1638,
         interconnect="Infinity Fabric (400 GB/s per GCD)", interconnect_gbs=400, ecc=True,
         cost_index=30, slurm_gres="mi250x", k8s_resource="amd.com/gpu",
         k8s_product="AMD_Instinct_MI250X"),
    # Cambricon MLU370-X8 product page (48 GB LPDDR5, 614.4 GB/s, FP32 24, FP16/BF16 96 TFLOP/s,
    # MLU-Link 200 GB/s). No FP64 units, and the page states no ECC, so it is recorded as absent.
    # Cost: no public cloud price; estimated at the A40 tier it competes in.
    dict(slug="mlu370-x8", vendor="cambricon", name="MLU370-X8", memory_gb=48, fp64_tflops=0,
         fp32_tflops=24, fp16_tflops=96, memory_bandwidth_gbs=614, interconnect="MLU-Link (200 GB/s)",
         interconnect_gbs=200, ecc=False, cost_index=30, slurm_gres="mlu370",
         k8s_resource="cambricon.com/mlu", k8s_product="MLU370-X8"),
    # Hygon DCU Z100 (深算一号): Hygon publishes no full datasheet. 32 GB HBM2 at 1024 GB/s and
    # FP64 ≈ 10.8 TFLOP/s as reported at launch; FP32 and FP16 from the 1:2:4 rates of its gfx906
    # (Vega 20 class) cores, which have no matrix units. ECC: HBM2 with SRAM ECC (gfx906:sramecc+).
    # Approximate: correct it from your vendor's sheet. Cost: no public price; set at the MI250X
    # GCD's tier rather than the V100S's, so that guessed figures don't rank it first for MD.
    dict(slug="dcu-z100", vendor="hygon", name="DCU Z100", memory_gb=32, fp64_tflops=10.8,
         fp32_tflops=21.6, fp16_tflops=43.2, memory_bandwidth_gbs=1024, interconnect="PCIe 4.0 x16 (64 GB/s)",
         interconnect_gbs=64, ecc=True, cost_index=30, slurm_gres="z100",
         k8s_resource="hygon.com/dcunum", k8s_product="Z100"),
]


def _fmt(x):
    return f"{x:g}"


def ai_rank(gpu):
    """AI training: ≥ 80 GB first, then NVLink-class links (≥ 300 GB/s), then dense FP16/BF16
    throughput, then memory."""
    return (gpu["memory_gb"] < AI_MEMORY_GB, gpu["interconnect_gbs"] < FAST_LINK_GBS,
            -gpu["fp16_tflops"], -gpu["memory_gb"])


def ai_reason(gpu):
    size = "≥ 80 GB: few GPUs hold a model's training states" if gpu["memory_gb"] >= AI_MEMORY_GB else (
        "< 80 GB: models must be sharded over more GPUs")
    link = "fast enough for sharded training" if gpu["interconnect_gbs"] >= FAST_LINK_GBS else (
        "PCIe-class, slows sharded training")
    return (f"{gpu['memory_gb']} GB ({size}); {_fmt(gpu['interconnect_gbs'])} GB/s GPU-to-GPU ({link}); "
            f"{_fmt(gpu['fp16_tflops'])} TFLOP/s dense FP16/BF16.")


def md_index(gpu):
    """MD kernels are FP32 arithmetic on pair forces and bandwidth-bound in PME and integration,
    so neither figure alone predicts ns/day: the geometric mean of both is the throughput index
    (clusters/advisor/md.py sizes jobs by the same index)."""
    return math.sqrt(gpu["fp32_tflops"] * gpu["memory_bandwidth_gbs"])


def md_rank(gpu):
    """Molecular dynamics: throughput per cost (ns/day per GPU-hour paid), then bandwidth."""
    return (-md_index(gpu) / gpu["cost_index"], -gpu["memory_bandwidth_gbs"])


def md_reason(gpu):
    index = md_index(gpu)
    return (f"{gpu['memory_bandwidth_gbs']} GB/s memory, {_fmt(gpu['fp32_tflops'])} TFLOP/s FP32: "
            f"throughput index √(FP32 × GB/s) = {index:.0f}; at cost index {gpu['cost_index']} that is "
            f"{index / gpu['cost_index']:.2f} per cost unit. In-node halo exchange: {gpu['interconnect']}.")


def cfd_rank(gpu):
    """CFD/FEA: ECC first (a flipped bit in a week-long solve goes unnoticed), then FP64
    throughput, then memory bandwidth (what sparse solvers mostly wait on)."""
    return (not gpu["ecc"], -gpu["fp64_tflops"], -gpu["memory_bandwidth_gbs"])


def cfd_reason(gpu):
    ecc = "ECC memory" if gpu["ecc"] else "no ECC stated"
    if not gpu["fp64_tflops"]:
        return f"No FP64 units: FP64 solvers cannot run, mixed precision only; {ecc}."
    return (f"{_fmt(gpu['fp64_tflops'])} TFLOP/s FP64, {gpu['memory_bandwidth_gbs']} GB/s memory, {ecc}, "
            f"{gpu['memory_gb']} GB.")


SCENARIOS = [
    dict(
        slug="ai-training", name="AI training", advisor="ai", default_walltime_minutes=24 * 60,
        description=(
            "Training and fine-tuning neural networks (language and vision models) with PyTorch "
            "DDP/FSDP or DeepSpeed under torchrun, or Horovod. Wants large GPU memory and fast "
            "GPU-to-GPU links; multi-node jobs use NCCL over InfiniBand."
        ),
        env={
            "NCCL_DEBUG": "WARN",
            "NCCL_IB_DISABLE": "0",
            # NCCL's exclusion syntax: any interface but loopback and the Docker bridge.
            "NCCL_SOCKET_IFNAME": "^lo,docker0",
            "OMP_NUM_THREADS": "8",
            # Fewer out-of-memory failures from fragmentation when sequence lengths vary.
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        },
        rank=ai_rank, reason=ai_reason,
    ),
    dict(
        slug="molecular-dynamics", name="Molecular dynamics", advisor="md", default_walltime_minutes=48 * 60,
        description=(
            "Classical molecular dynamics with GROMACS, LAMMPS, AMBER or NAMD: one GPU per MPI "
            "rank, several OpenMP threads per rank, multi-node runs over MPI. Throughput follows "
            "memory bandwidth and FP32 rate; cost per simulated nanosecond decides."
        ),
        env={
            "OMP_NUM_THREADS": "4",
            "OMP_PLACES": "cores",
            # GROMACS: halo exchange and PME straight between GPUs when MPI is CUDA-aware.
            "GMX_ENABLE_DIRECT_GPU_COMM": "1",
        },
        rank=md_rank, reason=md_reason,
    ),
    dict(
        slug="cfd", name="Engineering simulation (CFD and FEA)", advisor="cfd",
        default_walltime_minutes=24 * 60,
        description=(
            "Computational fluid dynamics (OpenFOAM, Fluent, STAR-CCM+) and finite-element "
            "analysis: domain-decomposed MPI solvers in double precision. Wants FP64 throughput, "
            "memory bandwidth and ECC memory."
        ),
        env={
            # Flat MPI: one rank per core (or per GPU) is how these solvers decompose.
            "OMP_NUM_THREADS": "1",
        },
        rank=cfd_rank, reason=cfd_reason,
    ),
]


def seed(apps, schema_editor):
    GpuModel = apps.get_model("clusters", "GpuModel")
    Scenario = apps.get_model("clusters", "Scenario")
    ScenarioGpu = apps.get_model("clusters", "ScenarioGpu")
    models_by_slug = {}
    for figures in GPU_MODELS:
        fields = dict(figures)
        slug = fields.pop("slug")
        models_by_slug[slug], _ = GpuModel.objects.update_or_create(slug=slug, defaults=fields)
    for spec in SCENARIOS:
        fields = {k: v for k, v in spec.items() if k not in ("slug", "rank", "reason")}
        scenario, _ = Scenario.objects.update_or_create(slug=spec["slug"], defaults=fields)
        scenario.ranking.all().delete()
        ranked = sorted(GPU_MODELS, key=lambda gpu, rule=spec["rank"]: (rule(gpu), gpu["slug"]))
        ScenarioGpu.objects.bulk_create(
            ScenarioGpu(scenario=scenario, gpu_model=models_by_slug[gpu["slug"]], rank=rank,
                        reason=spec["reason"](gpu))
            for rank, gpu in enumerate(ranked, start=1)
        )


def unseed(apps, schema_editor):
    Scenario = apps.get_model("clusters", "Scenario")
    ScenarioGpu = apps.get_model("clusters", "ScenarioGpu")
    GpuModel = apps.get_model("clusters", "GpuModel")
    gpu_slugs = [g["slug"] for g in GPU_MODELS]
    Scenario.objects.filter(slug__in=[s["slug"] for s in SCENARIOS]).delete()
    # Rankings of admin-added scenarios name these models too; without the models they mean
    # nothing. Partitions and quota that use a model still protect it: that reverse must fail.
    ScenarioGpu.objects.filter(gpu_model__slug__in=gpu_slugs).delete()
    GpuModel.objects.filter(slug__in=gpu_slugs).delete()


class Migration(migrations.Migration):
    dependencies = [("clusters", "0001_initial")]

    operations = [migrations.RunPython(seed, unseed)]
