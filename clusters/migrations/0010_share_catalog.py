"""The catalog's shares (clusters/shares.py): which kinds each model supports, the MIG profiles of
the models that have MIG, the sources of the figures, and the Huawei Ascend 910B, ranked in the
seeded scenarios by the rules of 0002.

MIG profiles are NVIDIA's MIG User Guide's tables ("Supported MIG Profiles"): per profile the
compute slices (of 7), memory slices (of 8), memory and the most instances of it on one device.
Slices are HAMi's (docs of Project-HAMi/HAMi: NVIDIA, Cambricon MLU, Hygon DCU, Ascend); shards are
Slurm's gres/shard, which any GPU GRES can carry; AMD's MI250X has no memory-capped sharing in
HAMi, so it offers whole GCDs and shards.
"""

import importlib

from django.db import migrations

SEED = importlib.import_module("clusters.migrations.0002_seed_catalog")


def profile(name, compute, memory_slices, memory_gb, instances_max):
    return dict(
        name=name,
        compute_slices=compute,
        memory_slices=memory_slices,
        memory_gb=memory_gb,
        instances_max=instances_max,
    )


MIG_H200 = [
    profile("1g.18gb", 1, 1, 18, 7),
    profile("1g.35gb", 1, 2, 35, 4),
    profile("2g.35gb", 2, 2, 35, 3),
    profile("3g.71gb", 3, 4, 71, 2),
    profile("4g.71gb", 4, 4, 71, 1),
    profile("7g.141gb", 7, 8, 141, 1),
]
MIG_80GB = [
    profile("1g.10gb", 1, 1, 10, 7),
    profile("1g.20gb", 1, 2, 20, 4),
    profile("2g.20gb", 2, 2, 20, 3),
    profile("3g.40gb", 3, 4, 40, 2),
    profile("4g.40gb", 4, 4, 40, 1),
    profile("7g.80gb", 7, 8, 80, 1),
]
MIG_A100_40GB = [
    profile("1g.5gb", 1, 1, 5, 7),
    profile("1g.10gb", 1, 2, 10, 4),
    profile("2g.10gb", 2, 2, 10, 3),
    profile("3g.20gb", 3, 4, 20, 2),
    profile("4g.20gb", 4, 4, 20, 1),
    profile("7g.40gb", 7, 8, 40, 1),
]

MIG_GUIDE = "NVIDIA Multi-Instance GPU User Guide, Supported MIG Profiles (docs.nvidia.com/datacenter/tesla/mig-user-guide)"
HAMI = "HAMi device sharing (github.com/Project-HAMi/HAMi, docs/)"
SHARD = "Slurm gres.conf(5) and gres.html, Sharding (slurm.schedmd.com)"

SHARES = {
    "h200": (
        ["whole", "mig", "slice", "shard"],
        MIG_H200,
        ["NVIDIA H200 Tensor Core GPU datasheet", MIG_GUIDE, HAMI, SHARD],
    ),
    "h100-80gb": (
        ["whole", "mig", "slice", "shard"],
        MIG_80GB,
        ["NVIDIA H100 Tensor Core GPU datasheet", MIG_GUIDE, HAMI, SHARD],
    ),
    "a100-80gb": (
        ["whole", "mig", "slice", "shard"],
        MIG_80GB,
        ["NVIDIA A100 Tensor Core GPU datasheet", MIG_GUIDE, HAMI, SHARD],
    ),
    "a100-40gb": (
        ["whole", "mig", "slice", "shard"],
        MIG_A100_40GB,
        ["NVIDIA A100 Tensor Core GPU datasheet", MIG_GUIDE, HAMI, SHARD],
    ),
    "l40s": (["whole", "slice", "shard"], [], ["NVIDIA L40S datasheet (no MIG)", HAMI, SHARD]),
    "a40": (["whole", "slice", "shard"], [], ["NVIDIA A40 datasheet (no MIG)", HAMI, SHARD]),
    "a10": (["whole", "slice", "shard"], [], ["NVIDIA A10 datasheet (no MIG)", HAMI, SHARD]),
    "t4": (["whole", "slice", "shard"], [], ["NVIDIA T4 datasheet (no MIG)", HAMI, SHARD]),
    "v100s": (["whole", "slice", "shard"], [], ["NVIDIA V100 datasheet (no MIG)", HAMI, SHARD]),
    "mi250x": (
        ["whole", "shard"],
        [],
        ["AMD Instinct MI250X datasheet", "AMD GPU device plugin (amd.com/gpu)", SHARD],
    ),
    "mlu370-x8": (
        ["whole", "slice"],
        [],
        ["Cambricon MLU370-X8 product page", HAMI + ": cambricon-mlu-support"],
    ),
    "dcu-z100": (
        ["whole", "slice", "shard"],
        [],
        ["Hygon DCU Z100 launch figures (no public datasheet)", HAMI + ": hygon-dcu-support", SHARD],
    ),
}

# Huawei Ascend 910B: Huawei publishes no full datasheet. 64 GB HBM2e and HCCS (7 links of 56 GB/s,
# 392 GB/s) as Huawei's Atlas 800T A2 material and its partners state them; memory bandwidth 1.6 TB/s
# and dense FP16 313 TFLOP/s as commonly reported for the 910B3 that Atlas 800T A2 nodes carry (gitee
# AI's cluster docs list 280 for the variant they run). FP32 ≈ 1/4 of FP16 (vector units), no FP64
# units. Cost: no public cloud price; estimated at the A100-80GB tier it competes in. Correct all of
# this from your vendor's sheet.
ASCEND_910B = dict(
    slug="ascend-910b",
    vendor="huawei",
    name="Ascend 910B",
    memory_gb=64,
    fp64_tflops=0,
    fp32_tflops=78,
    fp16_tflops=313,
    memory_bandwidth_gbs=1600,
    interconnect="HCCS (7 × 56 GB/s)",
    interconnect_gbs=392,
    ecc=True,
    cost_index=55,
    slurm_gres="ascend910b",
    k8s_resource="huawei.com/Ascend910B",
    k8s_product="Ascend910B",
)
# Whole devices only: HAMi shares an Ascend by vNPU templates (fixed memory and AI cores, e.g. 16 GiB
# with 5 of 20 cores), not by a free memory cap, so a slice's fraction here would not be what it holds.
ASCEND_SHARES = (
    ["whole"],
    [],
    [
        "Huawei Atlas 800T A2 training server material (64 GB HBM2e, HCCS)",
        "Reported Ascend 910B3 figures (FP16 313 TFLOP/s, 1.6 TB/s); no vendor datasheet is public",
        HAMI + ": ascend-device-support",
    ],
)


def forward(apps, schema_editor):
    GpuModel = apps.get_model("clusters", "GpuModel")
    Scenario = apps.get_model("clusters", "Scenario")
    ScenarioGpu = apps.get_model("clusters", "ScenarioGpu")
    for slug, (kinds, profiles, sources) in SHARES.items():
        GpuModel.objects.filter(slug=slug).update(
            share_kinds=kinds, mig_profiles=profiles, sources="\n".join(sources)
        )
    kinds, profiles, sources = ASCEND_SHARES
    fields = {k: v for k, v in ASCEND_910B.items() if k != "slug"}
    GpuModel.objects.update_or_create(
        slug=ASCEND_910B["slug"],
        defaults={**fields, "share_kinds": kinds, "mig_profiles": profiles, "sources": "\n".join(sources)},
    )
    # The seeded scenarios ranked again with it, by 0002's rules over 0002's figures and its own.
    catalog = [*SEED.GPU_MODELS, ASCEND_910B]
    by_slug = {m.slug: m for m in GpuModel.objects.filter(slug__in=[g["slug"] for g in catalog])}
    for spec in SEED.SCENARIOS:
        scenario = Scenario.objects.filter(slug=spec["slug"]).first()
        if scenario is None:
            continue
        ranked = sorted(catalog, key=lambda gpu, rule=spec["rank"]: (rule(gpu), gpu["slug"]))
        # An admin's own additions to the ranking keep their order, after the catalog's models.
        others = list(
            ScenarioGpu.objects.filter(scenario=scenario)
            .exclude(gpu_model__slug__in=by_slug)
            .order_by("rank")
        )
        ScenarioGpu.objects.filter(scenario=scenario).delete()
        rows = [
            ScenarioGpu(
                scenario=scenario, gpu_model=by_slug[gpu["slug"]], rank=rank, reason=spec["reason"](gpu)
            )
            for rank, gpu in enumerate(ranked, start=1)
        ]
        rows += [
            ScenarioGpu(
                scenario=scenario, gpu_model_id=row.gpu_model_id, rank=len(ranked) + n, reason=row.reason
            )
            for n, row in enumerate(others, start=1)
        ]
        ScenarioGpu.objects.bulk_create(rows)


def backward(apps, schema_editor):
    GpuModel = apps.get_model("clusters", "GpuModel")
    ScenarioGpu = apps.get_model("clusters", "ScenarioGpu")
    ScenarioGpu.objects.filter(gpu_model__slug=ASCEND_910B["slug"]).delete()
    GpuModel.objects.filter(slug=ASCEND_910B["slug"]).delete()


class Migration(migrations.Migration):
    dependencies = [("clusters", "0009_shares")]

    operations = [migrations.RunPython(forward, backward)]
