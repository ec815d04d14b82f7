"""The sizing advisor's text in Simplified Chinese (clusters/advisor/): every
line it writes is translated and carries the figures of the English run; the English text is
unchanged; and POST /api/v1/scenarios/{slug}/advise/ answers in the Accept-Language asked for.

Reads the project's catalogue, locale/zh_Hans, compiled (django.mo)."""

import importlib
import re
from dataclasses import dataclass, field

import pytest
from django.utils import translation

from clusters import advisor
from clusters.models import GpuModel
from tests.factories import seed_catalog

MIG_80GB = importlib.import_module("clusters.migrations.0010_share_catalog").MIG_80GB

NUMBER = re.compile(r"\d+(?:[.,]\d+)*(?:e[+-]?\d+)?")
CJK = re.compile(r"[\u4e00-\u9fff]")
# Words of the English text that a translated line has no reason to keep.
ENGLISH = re.compile(r"\b(the|of|and|per|for|at most|GPUs|atoms|cells|days|hours|tokens|Memory|Target)\b")


@dataclass(frozen=True)
class Gpu:
    slug: str
    name: str
    memory_gb: int
    fp64_tflops: float
    fp32_tflops: float
    fp16_tflops: float
    memory_bandwidth_gbs: int
    interconnect_gbs: int
    cost_index: int = 100
    share_kinds: list[str] = field(default_factory=lambda: ["whole"])
    mig_profiles: list[dict] = field(default_factory=list)


# Datasheet figures and shares, as seeded; the last one has no FP32 or FP16 units, to be left out
# (and no share but the whole device).
H100 = Gpu("h100-80gb", "H100-80GB", 80, 34, 67, 989, 3350, 900, 100, ["whole", "mig", "slice"], MIG_80GB)
T4 = Gpu("t4", "T4", 16, 0.25, 8.1, 65, 320, 32, 12, ["whole", "slice"])
MLU370 = Gpu("mlu370-x8", "MLU370-X8", 48, 0, 24, 96, 614, 200, 30, ["whole", "slice"])
FP64_ONLY = Gpu("fp64-only", "FP64-only", 32, 10, 0, 0, 1000, 64, 50)
GPUS = [H100, T4, MLU370, FP64_ONLY]

# Between them, every message the advisor writes: each assumption, step and reason to leave out.
CASES = {
    "ai-default-tokens": (advisor.advise_ai, advisor.AiJob(params_b=7)),
    "ai-whole-nodes-capped-late": (advisor.advise_ai, advisor.AiJob(params_b=70, tokens_b=100, max_gpus=64)),
    "ai-fp8-lora": (
        advisor.advise_ai,
        advisor.AiJob(params_b=7, precision="fp8", method="lora", tokens_b=2, target_days=1),
    ),
    "ai-fp32": (advisor.advise_ai, advisor.AiJob(params_b=1, precision="fp32")),
    "md-days-speed-up": (advisor.advise_md, advisor.MdJob(atoms=1_000_000, ns_per_day=200, days=2)),
    "md-out-of-reach": (advisor.advise_md, advisor.MdJob(atoms=100_000, ns_per_day=10_000, simulated_ns=100)),
    "cfd-fp64-target": (advisor.advise_cfd, advisor.CfdJob(cells_m=20, iterations=2000, target_days=0.01)),
    "cfd-mixed-late": (
        advisor.advise_cfd,
        advisor.CfdJob(cells_m=1, iterations=100_000, precision="mixed", target_days=0.01),
    ),
    # Fractions of one device: MIG on the H100, slices on the T4 and the MLU370, a whole FP64-only.
    "ai-small-shares": (advisor.advise_ai, advisor.AiJob(params_b=1, method="lora")),
    "md-small-shares": (advisor.advise_md, advisor.MdJob(atoms=20_000, ns_per_day=100, simulated_ns=500)),
    # 14 GB: the H100 gets MIG 1g.20gb, the T4's slice would be the whole device.
    "md-no-smaller-share": (
        advisor.advise_md,
        advisor.MdJob(atoms=14_000_000, ns_per_day=0.1, simulated_ns=1),
    ),
    "cfd-small-shares": (advisor.advise_cfd, advisor.CfdJob(cells_m=1, iterations=100_000)),
}


def lines(advice: advisor.Advice) -> list[str]:
    return [*advice.assumptions, *(line for option in advice.options for line in option.arithmetic)]


def figures(advice: advisor.Advice) -> list[tuple]:
    return [
        (o.gpu_model, o.gpus, o.nodes, o.gpu_hours, len(o.arithmetic), o.share, o.device_fraction)
        for o in advice.options
    ]


def test_the_share_cases_write_every_kind_of_share_line():
    """The cases above reach each line of a fraction: MIG, slice, neither smaller than the whole
    device, and a model with no shares at all."""
    with translation.override("en"):
        written = [line for advise, job in CASES.values() for line in lines(advise(job, GPUS))]
    for start in ("MIG 1g.", "Slice: a memory cap", "No MIG profile or slice", "FP64-only offers no MIG"):
        assert any(line.startswith(start) for line in written), start
    assert any(line.startswith("Fractions:") for line in written)


@pytest.mark.parametrize("case", CASES)
def test_every_line_is_chinese_with_the_figures_of_the_english_run(case):
    advise, job = CASES[case]
    with translation.override("en"):
        english = advise(job, GPUS)
    with translation.override("zh-hans"):
        chinese = advise(job, GPUS)
    assert figures(chinese) == figures(english)
    assert len(chinese.assumptions) == len(english.assumptions)
    for en, zh in zip(lines(english), lines(chinese), strict=True):
        assert CJK.search(zh), f"untranslated: {zh}"
        assert not ENGLISH.search(zh), f"English left in: {zh}"
        # A translation may reorder the figures, never change or drop one.
        assert sorted(NUMBER.findall(zh)) == sorted(NUMBER.findall(en)), (en, zh)


def test_the_reasons_to_leave_a_model_out_are_chinese_too():
    with translation.override("zh-hans"):
        advice = advisor.advise_ai(advisor.AiJob(params_b=70, max_gpus=64), GPUS)
    left_out = advice.assumptions[-1]
    assert "T4" in left_out and "94" in left_out and "FP64-only" in left_out
    assert "；" in left_out and left_out.endswith("。")


def test_the_english_text_is_unchanged():
    with translation.override("en"):
        advice = advisor.advise_ai(advisor.AiJob(params_b=70, tokens_b=100, max_gpus=64), [H100, T4])
    assert advice.assumptions == [
        "Training tokens: 100e9.",
        "Memory: model and optimizer states sharded over all GPUs (ZeRO-3/FSDP), plus 20 % for activations "
        "(with checkpointing) and buffers; 90 % of each GPU's memory usable.",
        "Compute: 6·N·T FLOP for full training (forward 2, backward 4), 4·N·T for LoRA (no weight gradients "
        "for the frozen base); attention FLOPs not counted.",
        "Throughput: 40 % model-FLOPs utilisation (MFU) of the dense peak; 25 % when more than one GPU "
        "shares PCIe-class links (< 300 GB/s). GPU-hours do not grow with the GPU count (the MFU already "
        "pays for communication).",
        "Nodes of 8 GPUs; a multi-node job takes whole nodes; at most 64 GPUs; target 7 day(s).",
        "Left out (cannot run this job): T4 needs 94 GPUs of 16 GB for 1,344 GB, over max_gpus=64.",
    ]
    [h100] = advice.options
    assert h100.arithmetic == [
        "16 bytes/parameter for mixed-precision Adam (2 weights + 2 grads + 12 optimizer) × 70e9 = 1,120 GB",
        "+ 20 % for activations and buffers = 1,344 GB",
        "Usable memory per GPU: 90 % of 80 GB = 72 GB → ⌈1,344 / 72⌉ = 19 GPU(s) to hold the job",
        "Compute: 6 × 70e9 parameters × 100e9 tokens = 4.20e+22 FLOP",
        "At 40 % MFU of 989 TFLOP/s dense FP16/BF16 = 396 TFLOP/s per GPU: 4.20e+22 / 396e12 / 3600 = "
        "29,491 GPU-hours",
        "Target 7 day(s) = 168 h: ⌈29,491 / 168⌉ = 176 GPU(s)",
        "max(19, 176) = 176, in whole nodes of 8: 176 GPUs",
        "Capped at max_gpus = 64",
        "Wall time ≈ 29,491 / 64 = 461 h (19.2 days, beyond the 7-day target)",
    ]
    with translation.override("en"):
        md = advisor.advise_md(advisor.MdJob(atoms=1_000_000, ns_per_day=200, days=2), [H100])
        cfd = advisor.advise_cfd(advisor.CfdJob(cells_m=20, iterations=2000, target_days=0.01), [H100])
    assert md.assumptions[0] == "Simulated length: 400 ns (2 days at 200 ns/day)."
    assert "6 GPUs: speed-up 6 × 0.8^log2(6) = 3.37 → 214 ns/day" in md.options[0].arithmetic
    assert "Target 0.24 h: ⌈0.474 / (90 % × 0.24)⌉ = 3 GPUs; useful up to 20 (1 M cells each) → 3" in (
        cfd.options[0].arithmetic
    )


# --- The endpoint --------------------------------------------------------------------------------


@pytest.fixture
def seeded(db):
    if not GpuModel.objects.exists():
        seed_catalog()


@pytest.mark.parametrize(
    ("slug", "body"),
    [
        ("ai-training", {"params_b": 70, "max_gpus": 64}),
        ("molecular-dynamics", {"atoms": 250_000, "ns_per_day": 100, "days": 5}),
        ("cfd", {"cells_m": 20, "iterations": 2000}),
    ],
)
def test_advise_answers_in_the_language_asked_for(seeded, client_for, viewer, slug, body):
    client = client_for(viewer)
    url = f"/api/v1/scenarios/{slug}/advise/"
    chinese = client.post(url, body, format="json", HTTP_ACCEPT_LANGUAGE="zh-hans")
    english = client.post(url, body, format="json", HTTP_ACCEPT_LANGUAGE="en")
    assert chinese.status_code == english.status_code == 200, chinese.content
    assert chinese["Content-Language"] == "zh-hans"
    zh, en = chinese.json(), english.json()
    assert [o["gpus"] for o in zh["options"]] == [o["gpus"] for o in en["options"]]
    zh_lines = zh["assumptions"] + zh["options"][0]["arithmetic"]
    en_lines = en["assumptions"] + en["options"][0]["arithmetic"]
    assert all(CJK.search(line) for line in zh_lines), zh_lines
    assert not any(CJK.search(line) for line in en_lines), en_lines
