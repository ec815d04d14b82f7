"""The sizing advisor's fractions of a device (clusters/advisor/, clusters/shares.py): a job that
one GPU holds and runs fast enough gets the smallest MIG instance of the model that fits, else a
slice with a memory cap, counted in device-equivalent GPU-hours; the MD ranking by cost puts a
cheap fraction of a good device before a whole weaker one; and the advise answer and its schema
carry each option's share."""

import math
from decimal import Decimal

import pytest
from drf_spectacular.generators import SchemaGenerator

from clusters import advisor
from clusters.models import GpuModel
from jobs.serializers import JobIn
from tests.advisor_support import option, ranked
from tests.factories import seed_catalog

pytestmark = pytest.mark.django_db

SHARE_FIELDS = ("share", "mig_profile", "gpu_memory_mib", "gpu_cores_pct", "device_fraction")
# A small MD system: 20,000 atoms, below the latency-bound size, at 200 ns/day for 1,000 ns.
SMALL_MD = advisor.MdJob(atoms=20_000, ns_per_day=200, simulated_ns=1000)


@pytest.fixture(autouse=True)
def catalog():
    if not GpuModel.objects.exists():
        seed_catalog()


def md_one_gpu(slug: str, atoms: int = 50_000, timestep_fs: float = 2) -> float:
    """ns/day of one whole GPU of the model, as the MD advisor's calibration has it."""
    gpu = GpuModel.objects.get(slug=slug)
    return 67_000 * timestep_fs * math.sqrt(gpu.fp32_tflops * gpu.memory_bandwidth_gbs) / max(atoms, 50_000)


# --- The example of the issue: half an A100 before a whole T4 -------------------------------------


def test_a_small_md_system_gets_half_an_a100_which_outranks_a_whole_t4():
    gpus = ranked("molecular-dynamics")
    # The scenario ranks the whole T4 above the whole A100 (throughput per cost of whole devices).
    assert [g.slug for g in gpus].index("t4") < [g.slug for g in gpus].index("a100-80gb")
    advice = advisor.advise_md(SMALL_MD, gpus)

    a100 = option(advice, "a100-80gb")
    # 200 of one A100's 534 ns/day is 37 %: 3g (3/7 = 43 %) is the smallest profile that reaches it.
    assert (a100.share, a100.mig_profile, a100.gpus, a100.nodes) == ("mig", "3g.40gb", 1, 1)
    assert (a100.gpu_memory_mib, a100.gpu_cores_pct, a100.device_fraction) == (0, 0, Decimal("0.5"))
    rate = md_one_gpu("a100-80gb") * 3 / 7
    assert rate >= 200
    assert a100.gpu_hours == pytest.approx(1 * 0.5 * 1000 / rate * 24, abs=0.01)
    assert a100.arithmetic[4:] == [
        "One GPU holds the job and reaches 200 ns/day: 200 ÷ 534 = 37.4 % of its throughput is enough",
        "MIG 3g.40gb, the smallest profile that fits: 3/7 of the compute ≥ 37.4 %, 90 % of 40 GB = 36 GB "
        "≥ 0.02 GB; it counts max(3/7, 4/8) = 0.5 of the device",
        "At 0.429 of the GPU's speed: 0.429 × 534 ns/day = 229 ns/day",
        "1,000 ns ÷ 229 ns/day = 4.37 days × 24 h × 0.5 of a GPU = 52.4 GPU-hours (device-equivalent)",
        "Cost: 52.4 GPU-hours × cost index 55 = 2,882",
    ]

    t4 = option(advice, "t4")
    # One T4 runs 136 ns/day, and a system this small gains nothing from a second one.
    assert (t4.share, t4.gpus, t4.device_fraction) == ("whole", 1, Decimal(1))
    assert any(line.startswith("Short of the 200 ns/day asked") for line in t4.arithmetic)

    slugs = [o.gpu_model for o in advice.options]
    assert slugs.index("a100-80gb") < slugs.index("t4")
    assert any(a.startswith("Order: the options that reach 200 ns/day first") for a in advice.assumptions)
    assert any(
        "throughput is assumed to scale with its compute share (g/7 of a MIG instance" in a
        for a in advice.assumptions
    )


def test_md_options_reach_the_asked_rate_first_then_cost_least():
    gpus = ranked("molecular-dynamics")
    cost_index = {g.slug: g.cost_index for g in gpus}
    for job in (SMALL_MD, advisor.MdJob(atoms=100_000, ns_per_day=10_000, simulated_ns=100)):
        advice = advisor.advise_md(job, gpus)
        short = [any(line.startswith("Short of") for line in o.arithmetic) for o in advice.options]
        assert short == sorted(short)  # the ones that reach the ns/day, then the others
        for group in (False, True):
            costs = [
                o.gpu_hours * cost_index[o.gpu_model]
                for o, is_short in zip(advice.options, short, strict=True)
                if is_short == group
            ]
            assert costs == sorted(costs)


def test_ai_and_cfd_keep_the_scenario_order_with_fractions():
    for scenario, advise, job in (
        ("ai-training", advisor.advise_ai, advisor.AiJob(params_b=1, method="lora")),
        ("cfd", advisor.advise_cfd, advisor.CfdJob(cells_m=1, iterations=500_000)),
    ):
        order = [g.slug for g in ranked(scenario)]
        advice = advise(job, ranked(scenario))
        slugs = [o.gpu_model for o in advice.options]
        assert slugs == sorted(slugs, key=order.index)
        assert {o.share for o in advice.options} == {"whole", "mig", "slice"}


# --- Which fraction ------------------------------------------------------------------------------


def test_the_mig_profile_is_the_smallest_that_holds_the_memory():
    # 30 GB and a tenth of a ns/day: memory decides.
    advice = advisor.advise_md(
        advisor.MdJob(atoms=30_000_000, ns_per_day=0.1, simulated_ns=1), ranked("molecular-dynamics")
    )
    # A100-80GB: 1g.20gb and 2g.20gb hold 18 GB; 3g.40gb holds 36.
    assert option(advice, "a100-80gb").mig_profile == "3g.40gb"
    # H200: 1g.35gb (0.25 of the device) before 2g.35gb (2/7), both holding 31.5 GB.
    h200 = option(advice, "h200")
    assert (h200.mig_profile, h200.device_fraction) == ("1g.35gb", Decimal("0.25"))
    # A100-40GB: no profile short of 7g holds 30 GB; a slice of 34 GiB does.
    a100_40 = option(advice, "a100-40gb")
    assert (a100_40.share, a100_40.gpu_memory_mib, a100_40.device_fraction) == (
        "slice",
        34 * 1024,
        Decimal("0.85"),
    )


def test_the_mig_profile_is_the_smallest_that_keeps_the_pace():
    advice = advisor.advise_md(SMALL_MD, ranked("molecular-dynamics"))
    # One H100 runs 1,270 ns/day: 1g (1/7 → 181) is short of 200, 2g.20gb (2/7 → 363) is not.
    h100 = option(advice, "h100-80gb")
    assert (h100.mig_profile, h100.device_fraction) == ("2g.20gb", Decimal("0.2857"))
    assert md_one_gpu("h100-80gb") / 7 < 200 <= md_one_gpu("h100-80gb") * 2 / 7


def test_a_model_without_mig_gets_a_slice_with_a_memory_cap():
    advice = advisor.advise_md(SMALL_MD, ranked("molecular-dynamics"))
    l40s = option(advice, "l40s")
    # 200 of 754 ns/day: 26.5 %, so 27 % of the compute; 0.02 GB in a cap of 1 GiB.
    assert (l40s.share, l40s.mig_profile, l40s.gpus) == ("slice", "", 1)
    assert (l40s.gpu_memory_mib, l40s.gpu_cores_pct, l40s.device_fraction) == (1024, 27, Decimal("0.27"))
    rate = md_one_gpu("l40s") * 0.27
    assert rate >= 200
    assert l40s.gpu_hours == pytest.approx(0.27 * 1000 / rate * 24, abs=0.01)
    assert any(line.startswith("Slice: a memory cap of ⌈0.02 / 90 %⌉ = 1 GiB") for line in l40s.arithmetic)


def test_a_slice_takes_compute_up_to_its_memory_part_which_it_counts_anyway():
    advice = advisor.advise_md(
        advisor.MdJob(atoms=30_000_000, ns_per_day=0.1, simulated_ns=1), ranked("molecular-dynamics")
    )
    l40s = option(advice, "l40s")
    # ⌈30 / 0.9⌉ = 34 GiB of 48: 70.8 % of the memory; 8 % of the compute would do, 70 % costs no more.
    assert (l40s.gpu_memory_mib, l40s.gpu_cores_pct) == (34 * 1024, 70)
    assert l40s.device_fraction == Decimal("0.7083")


def test_a_job_that_needs_more_than_one_gpu_gets_whole_gpus():
    md = advisor.advise_md(
        advisor.MdJob(atoms=1_000_000, ns_per_day=200, days=2), ranked("molecular-dynamics")
    )
    ai = advisor.advise_ai(advisor.AiJob(params_b=7), ranked("ai-training"))  # 134 GB of states
    for advice in (md, ai):
        for o in advice.options:
            assert (o.share, o.mig_profile, o.gpu_memory_mib, o.gpu_cores_pct) == ("whole", "", 0, 0)
            assert o.device_fraction == 1
            assert not any("of a GPU" in line for line in o.arithmetic)
        assert not any(a.startswith("Fractions:") for a in advice.assumptions)


def test_a_model_without_mig_or_slices_stays_whole_and_says_why():
    mi250x = option(advisor.advise_md(SMALL_MD, ranked("molecular-dynamics")), "mi250x")
    assert (mi250x.share, mi250x.device_fraction) == ("whole", 1)
    assert "MI250X (one GCD) offers no MIG instances or slices: one whole GPU" in mi250x.arithmetic


def test_no_fraction_when_none_short_of_the_whole_device_holds_the_job():
    # 14 GB on a 16 GB T4: a slice would need ⌈14 / 0.9⌉ = 16 GiB, the whole device.
    advice = advisor.advise_md(
        advisor.MdJob(atoms=14_000_000, ns_per_day=0.1, simulated_ns=1), ranked("molecular-dynamics")
    )
    t4 = option(advice, "t4")
    assert (t4.share, t4.gpus, t4.device_fraction) == ("whole", 1, 1)
    assert any(
        line.startswith("No MIG profile or slice smaller than the whole GPU") for line in t4.arithmetic
    )


# --- Device-equivalent GPU-hours in the advisors that size by target time ------------------------


def test_ai_fraction_finishes_within_the_target_in_device_equivalent_hours():
    advice = advisor.advise_ai(advisor.AiJob(params_b=7, method="lora"), ranked("ai-training"))
    h100 = option(advice, "h100-80gb")
    # 18.1 GB: 1g.20gb and 2g.20gb hold 18; 3g.40gb is the smallest that fits.
    assert (h100.share, h100.mig_profile, h100.gpus, h100.device_fraction) == (
        "mig",
        "3g.40gb",
        1,
        Decimal("0.5"),
    )
    one_gpu_h = 4 * 7e9 * 1e9 / (989e12 * 0.40) / 3600
    wall_h = one_gpu_h / (3 / 7)
    assert wall_h <= 7 * 24
    assert h100.gpu_hours == pytest.approx(0.5 * wall_h, abs=0.01)
    assert h100.arithmetic[-1].endswith("0.5 of a GPU × 45.9 h = 22.9 GPU-hours (device-equivalent)")


def test_cfd_fraction_finishes_within_the_target_in_device_equivalent_hours():
    advice = advisor.advise_cfd(advisor.CfdJob(cells_m=1, iterations=500_000), ranked("cfd"))
    h100 = option(advice, "h100-80gb")
    one_gpu_h = 1e6 * 500_000 * (100_000 / (0.7 * 3350e9)) / 3600  # bandwidth-bound
    # 5.92 of 24 hours: 24.7 % of the compute, so 2g.20gb (2/7).
    assert (h100.mig_profile, h100.device_fraction) == ("2g.20gb", Decimal("0.2857"))
    wall_h = one_gpu_h / (2 / 7)
    assert wall_h <= 24
    assert h100.gpu_hours == pytest.approx(0.2857 * wall_h, abs=0.01)


# --- The answer and its schema -------------------------------------------------------------------


def test_advise_answers_each_options_share_as_a_job_asks_for_it(client_for, viewer):
    body = {"atoms": 20_000, "ns_per_day": 200, "simulated_ns": 1000}
    response = client_for(viewer).post("/api/v1/scenarios/molecular-dynamics/advise/", body, format="json")
    assert response.status_code == 200, response.content
    options = {o["gpu_model"]: o for o in response.json()["options"]}
    assert {k: options["a100-80gb"][k] for k in SHARE_FIELDS} == {
        "share": "mig",
        "mig_profile": "3g.40gb",
        "gpu_memory_mib": 0,
        "gpu_cores_pct": 0,
        "device_fraction": 0.5,
    }
    assert {k: options["l40s"][k] for k in SHARE_FIELDS} == {
        "share": "slice",
        "mig_profile": "",
        "gpu_memory_mib": 1024,
        "gpu_cores_pct": 27,
        "device_fraction": 0.27,
    }
    assert options["t4"]["share"] == "whole" and options["t4"]["device_fraction"] == 1
    slugs = list(options)
    assert slugs.index("a100-80gb") < slugs.index("t4")
    # The names of POST /jobs/'s share fields: an option is what a job asks for.
    assert set(SHARE_FIELDS) - {"device_fraction"} <= set(JobIn().fields)


def test_the_schema_shows_each_options_share():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    option_schema = schema["components"]["schemas"]["AdviceOptionOut"]
    assert set(option_schema["properties"]) == {
        "gpu_model",
        "gpus",
        "nodes",
        "gpu_hours",
        "arithmetic",
    } | set(SHARE_FIELDS)
    assert set(option_schema["required"]) >= {"gpu_model", "gpus", "nodes", "gpu_hours", "arithmetic"}
    share = option_schema["properties"]["share"]
    [ref] = [part["$ref"] for part in share.get("allOf", [share]) if "$ref" in part]
    # POST /jobs/'s choice set; the advisor proposes whole, mig or slice of it (above).
    assert schema["components"]["schemas"][ref.rsplit("/", 1)[-1]]["enum"] == [
        "whole",
        "mig",
        "slice",
        "shard",
    ]
