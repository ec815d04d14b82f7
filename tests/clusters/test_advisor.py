"""The sizing advisor: its arithmetic on known inputs (clusters/advisor/) and
POST /api/v1/scenarios/{slug}/advise/ with its input validation."""

import pytest

from clusters import advisor
from clusters.models import GpuModel, Scenario, ScenarioGpu
from tests.advisor_support import option, ranked
from tests.api_support import assert_problem
from tests.factories import seed_catalog

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def catalog():
    if not GpuModel.objects.exists():
        seed_catalog()


# --- AI training ---------------------------------------------------------------------------------


def test_7b_full_fine_tune_in_bf16_needs_two_80gb_gpus():
    advice = advisor.advise_ai(advisor.AiJob(params_b=7), ranked("ai-training"))
    h100 = option(advice, "h100-80gb")
    assert h100.arithmetic[0] == (
        "16 bytes/parameter for mixed-precision Adam (2 weights + 2 grads + 12 optimizer) × 7e9 = 112 GB"
    )
    assert h100.gpus == 2 and h100.nodes == 1
    # One H200 (141 GB) holds 112 GB of states but not the 20 % of activations on top.
    assert option(advice, "h200").gpus == 2


def test_lora_needs_far_less_memory_than_a_full_fine_tune():
    gpus = ranked("ai-training")
    full = advisor.advise_ai(advisor.AiJob(params_b=7), gpus)
    lora = advisor.advise_ai(advisor.AiJob(params_b=7, method="lora"), gpus)
    assert option(lora, "h100-80gb").gpus == 1
    assert option(lora, "a10").gpus == 1  # 15.1 GB of states + 20 % fits 24 GB
    assert option(lora, "a10").gpus < option(full, "a10").gpus
    assert "14 GB" in option(lora, "a10").arithmetic[0]
    # 4·N·T rather than 6·N·T: two thirds of the GPU-hours, compared on whole GPUs (1e12 tokens in
    # half a day take more than one H100 either way; the default job fits in a fraction of one).
    rushed = {"params_b": 7, "tokens_b": 1000, "target_days": 0.5}
    full_h100 = option(advisor.advise_ai(advisor.AiJob(**rushed), gpus), "h100-80gb")
    lora_h100 = option(advisor.advise_ai(advisor.AiJob(**rushed, method="lora"), gpus), "h100-80gb")
    assert full_h100.share == lora_h100.share == "whole"
    assert lora_h100.gpu_hours == pytest.approx(full_h100.gpu_hours * 2 / 3, 0.01)


def test_gpu_hours_are_6nt_at_40_percent_mfu():
    advice = advisor.advise_ai(advisor.AiJob(params_b=7, tokens_b=10), ranked("ai-training"))
    expected = 6 * 7e9 * 10e9 / (989e12 * 0.40) / 3600
    assert option(advice, "h100-80gb").gpu_hours == pytest.approx(expected, abs=0.01)
    assert any("40 % MFU" in line for line in option(advice, "h100-80gb").arithmetic)


def test_fp32_runs_at_the_fp32_rate_and_pcie_gpus_at_a_lower_mfu():
    gpus = ranked("ai-training")
    fp32 = advisor.advise_ai(advisor.AiJob(params_b=1, precision="fp32"), gpus)
    h100 = option(fp32, "h100-80gb")
    one_gpu_h = 6e18 / (67e12 * 0.40) / 3600
    assert any(line.startswith("At 40 % MFU of 67 TFLOP/s dense FP32") for line in h100.arithmetic)
    # 19.2 GB and 62 hours of one H100 fit in MIG 3g.40gb (half the device, 3/7 of its compute)
    # within the 7 days: device-equivalent GPU-hours.
    assert (h100.share, h100.mig_profile) == ("mig", "3g.40gb")
    assert h100.gpu_hours == pytest.approx(one_gpu_h * 0.5 / (3 / 7), abs=0.01)
    big = advisor.advise_ai(advisor.AiJob(params_b=7), gpus)
    t4 = option(big, "t4")
    assert t4.gpus > 1 and any("25 % MFU" in line for line in t4.arithmetic)


def test_training_target_sets_the_gpu_count_in_whole_nodes():
    advice = advisor.advise_ai(advisor.AiJob(params_b=70, tokens_b=100, target_days=7), ranked("ai-training"))
    h100 = option(advice, "h100-80gb")
    assert h100.gpus % 8 == 0 and h100.nodes == h100.gpus // 8
    assert h100.gpu_hours / h100.gpus <= 7 * 24


def test_models_that_cannot_hold_the_job_are_left_out_and_named():
    job = advisor.AiJob(params_b=70, max_gpus=64)  # 1,344 GB with activations
    advice = advisor.advise_ai(job, ranked("ai-training"))
    slugs = [o.gpu_model for o in advice.options]
    assert "t4" not in slugs  # 16 GB: 94 GPUs
    assert "h100-80gb" in slugs
    assert any(a.startswith("Left out") and "T4 needs 94 GPUs" in a for a in advice.assumptions)


def test_default_token_count_is_stated():
    advice = advisor.advise_ai(advisor.AiJob(params_b=7), ranked("ai-training"))
    assert any("Training tokens: 1e9 (none given" in a for a in advice.assumptions)
    given = advisor.advise_ai(advisor.AiJob(params_b=7, tokens_b=20), ranked("ai-training"))
    assert "Training tokens: 20e9." in given.assumptions


# --- Molecular dynamics --------------------------------------------------------------------------


def test_md_days_and_simulated_ns_give_the_same_answer():
    gpus = ranked("molecular-dynamics")
    by_ns = advisor.advise_md(advisor.MdJob(atoms=500_000, ns_per_day=50, simulated_ns=500), gpus)
    by_days = advisor.advise_md(advisor.MdJob(atoms=500_000, ns_per_day=50, days=10), gpus)
    assert by_ns.options == by_days.options


def test_md_wants_more_gpus_for_more_ns_per_day():
    gpus = ranked("molecular-dynamics")
    slow = advisor.advise_md(advisor.MdJob(atoms=1_000_000, ns_per_day=10, simulated_ns=100), gpus)
    fast = advisor.advise_md(advisor.MdJob(atoms=1_000_000, ns_per_day=200, simulated_ns=100), gpus)
    assert option(slow, "a100-80gb").gpus == 1
    assert option(fast, "a100-80gb").gpus > 1
    # One A100 on 1 M atoms at 4 fs: the calibration point, ≈ 50 ns/day.
    calibration = advisor.advise_md(
        advisor.MdJob(atoms=1_000_000, ns_per_day=1, simulated_ns=50, timestep_fs=4), gpus
    )
    assert option(calibration, "a100-80gb").gpu_hours == pytest.approx(24, rel=0.1)


def test_md_says_when_the_wanted_rate_is_out_of_reach():
    advice = advisor.advise_md(
        advisor.MdJob(atoms=100_000, ns_per_day=10_000, simulated_ns=100), ranked("molecular-dynamics")
    )
    t4 = option(advice, "t4")
    assert t4.gpus == 4  # 100,000 atoms / 25,000 per GPU
    assert any(line.startswith("Short of the 10000 ns/day") for line in t4.arithmetic)


# --- CFD / FEA -----------------------------------------------------------------------------------


def test_cfd_fp64_leaves_out_models_without_fp64_units_and_mixed_keeps_them():
    gpus = ranked("cfd")
    fp64 = advisor.advise_cfd(advisor.CfdJob(cells_m=10, iterations=1000), gpus)
    mixed = advisor.advise_cfd(advisor.CfdJob(cells_m=10, iterations=1000, precision="mixed"), gpus)
    assert "mlu370-x8" not in [o.gpu_model for o in fp64.options]
    assert "MLU370-X8 has no FP64 units" in fp64.assumptions[-1]
    assert "mlu370-x8" in [o.gpu_model for o in mixed.options]
    # Options keep the scenario's rank order.
    assert [o.gpu_model for o in fp64.options] == [g.slug for g in gpus if g.fp64_tflops]


def test_cfd_memory_and_roofline_arithmetic():
    advice = advisor.advise_cfd(advisor.CfdJob(cells_m=1000, iterations=100), ranked("cfd"))
    h100 = option(advice, "h100-80gb")
    assert h100.arithmetic[0] == "Memory: 1000 M cells × 2 GB = 2,000 GB"
    assert h100.gpus == 28  # ⌈2000 / 72⌉
    assert "bandwidth-bound" in h100.arithmetic[2]
    t4 = option(advisor.advise_cfd(advisor.CfdJob(cells_m=1, iterations=100), ranked("cfd")), "t4")
    assert "compute-bound" in t4.arithmetic[2]  # 0.25 TFLOP/s FP64


# --- The endpoint --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slug", "body"),
    [
        ("ai-training", {"params_b": 7}),
        (
            "ai-training",
            {"params_b": 7, "precision": "fp8", "method": "lora", "tokens_b": 2, "target_days": 1},
        ),
        ("molecular-dynamics", {"atoms": 250_000, "ns_per_day": 100, "days": 5}),
        ("cfd", {"cells_m": 20, "iterations": 2000, "precision": "mixed", "gpus_per_node": 4}),
    ],
)
def test_advise_answers_options_in_rank_order(client_for, viewer, slug, body):
    response = client_for(viewer).post(f"/api/v1/scenarios/{slug}/advise/", body)
    assert response.status_code == 200, response.content
    advice = response.json()
    assert set(advice) == {"assumptions", "options"}
    assert advice["assumptions"] and all(isinstance(a, str) for a in advice["assumptions"])
    order = [g.slug for g in ranked(slug)]
    slugs = [o["gpu_model"] for o in advice["options"]]
    if slug == "molecular-dynamics":
        # MD ranks by cost, as its scenario ranks models (every model reaches 100 ns/day here).
        cost_index = {g.slug: g.cost_index for g in ranked(slug)}
        costs = [o["gpu_hours"] * cost_index[o["gpu_model"]] for o in advice["options"]]
        assert costs == sorted(costs)
    else:
        assert slugs == sorted(slugs, key=order.index)
    first = advice["options"][0]
    # The contract's fields (docs/api.md), and the share each option proposes.
    assert set(first) == {"gpu_model", "gpus", "nodes", "gpu_hours", "arithmetic"} | {
        "share",
        "mig_profile",
        "gpu_memory_mib",
        "gpu_cores_pct",
        "device_fraction",
    }
    assert first["gpus"] >= 1 and first["nodes"] >= 1 and first["gpu_hours"] > 0
    assert all(isinstance(line, str) for line in first["arithmetic"])


@pytest.mark.parametrize(
    ("slug", "body", "field"),
    [
        ("ai-training", {}, "params_b"),
        ("ai-training", {"params_b": "seven"}, "params_b"),
        ("ai-training", {"params_b": True}, "params_b"),
        ("ai-training", {"params_b": [7]}, "params_b"),
        ("ai-training", {"params_b": -7}, "params_b"),
        ("ai-training", {"params_b": 0}, "params_b"),
        ("ai-training", {"params_b": 1e12}, "params_b"),
        ("ai-training", {"params_b": 7, "precision": "fp4"}, "precision"),
        ("ai-training", {"params_b": 7, "method": "qlora"}, "method"),
        ("ai-training", {"params_b": 7, "tokens_b": 0}, "tokens_b"),
        ("ai-training", {"params_b": 7, "target_days": -1}, "target_days"),
        ("ai-training", {"params_b": 7, "gpus_per_node": 0}, "gpus_per_node"),
        ("ai-training", {"params_b": 7, "max_gpus": 1.5}, "max_gpus"),
        ("molecular-dynamics", {"ns_per_day": 10, "days": 1}, "atoms"),
        ("molecular-dynamics", {"atoms": 100000.5, "ns_per_day": 10, "days": 1}, "atoms"),
        ("molecular-dynamics", {"atoms": 100000, "ns_per_day": 0, "days": 1}, "ns_per_day"),
        ("molecular-dynamics", {"atoms": 100000, "ns_per_day": 10}, "simulated_ns"),
        ("molecular-dynamics", {"atoms": 100000, "ns_per_day": 10, "days": 1, "simulated_ns": 5}, "days"),
        (
            "molecular-dynamics",
            {"atoms": 100000, "ns_per_day": 10, "days": 1, "timestep_fs": 20},
            "timestep_fs",
        ),
        ("cfd", {"cells_m": 10}, "iterations"),
        ("cfd", {"cells_m": "lots", "iterations": 10}, "cells_m"),
        ("cfd", {"cells_m": 10, "iterations": -5}, "iterations"),
        ("cfd", {"cells_m": 10, "iterations": 5, "precision": "fp32"}, "precision"),
    ],
)
def test_bad_advice_input_is_400_naming_the_field(client_for, member, slug, body, field):
    response = client_for(member).post(f"/api/v1/scenarios/{slug}/advise/", body)
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == "invalid"
    assert field in problem["errors"]
    assert field in problem["detail"]


def test_a_body_that_is_not_an_object_is_400(client_for, member):
    response = client_for(member).post("/api/v1/scenarios/cfd/advise/", [1, 2], format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid"


def test_advise_on_unknown_scenario_is_404(client_for, member):
    response = client_for(member).post("/api/v1/scenarios/no-such/advise/", {"params_b": 7})
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_advise_on_a_scenario_without_advisor_is_404_saying_so(client_for, member):
    Scenario.objects.create(slug="rendering", name="Rendering", description="d", default_walltime_minutes=60)
    response = client_for(member).post("/api/v1/scenarios/rendering/advise/", {"params_b": 7})
    assert response.status_code == 404
    assert response.json()["detail"] == "Scenario 'rendering' has no sizing advisor."


def test_an_admin_added_scenario_reuses_an_advisor(client_for, member):
    scenario = Scenario.objects.create(
        slug="llm-inference-tuning",
        name="LLM tuning",
        description="d",
        default_walltime_minutes=60,
        advisor="ai",
    )
    ScenarioGpu.objects.create(
        scenario=scenario, gpu_model=GpuModel.objects.get(slug="l40s"), rank=1, reason="r"
    )
    response = client_for(member).post(f"/api/v1/scenarios/{scenario.slug}/advise/", {"params_b": 1})
    assert [o["gpu_model"] for o in response.json()["options"]] == ["l40s"]


def test_advise_needs_authentication_and_post(anon_client, client_for, member):
    assert (
        anon_client.post("/api/v1/scenarios/cfd/advise/", {"cells_m": 1, "iterations": 1}).status_code == 401
    )
    assert client_for(member).get("/api/v1/scenarios/cfd/advise/").status_code == 405


def test_a_number_beyond_any_float_is_400(client_for, member):
    # JSON has no limit; DRF's FloatField let OverflowError through.
    response = client_for(member).post(
        "/api/v1/scenarios/ai-training/advise/", {"params_b": 10**400}, format="json"
    )
    assert list(assert_problem(response, 400, "invalid")["errors"]) == ["params_b"]


def test_the_advisor_api_takes_numbers_not_numerals(client_for, member):
    client = client_for(member)
    refused = client.post("/api/v1/scenarios/ai-training/advise/", {"params_b": "7"}, format="json")
    assert list(assert_problem(refused, 400, "invalid")["errors"]) == ["params_b"]
    assert (
        client.post("/api/v1/scenarios/ai-training/advise/", {"params_b": 7}, format="json").status_code
        == 200
    )
