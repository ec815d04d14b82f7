"""The budget tests' price list and job bodies: one price for the catalog's GPU model since long
ago, so that a GPU-hour costs `PER_GPU_HOUR`, and a submission's body or request."""

from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from billing.models import Price
from jobs.services import JobRequest

PER_GPU_HOUR = Decimal("10.0000")
SCRIPT = "#!/bin/bash\ntrue\n"


def priced(gpu_model, per_gpu_hour: Decimal = PER_GPU_HOUR) -> Price:
    return Price.objects.create(
        gpu_model=gpu_model, per_gpu_hour=per_gpu_hour, effective_from=timezone.now() - timedelta(days=400)
    )


def job_body(**overrides) -> dict:
    """POST /api/v1/jobs/: 2 GPUs for an hour, 2 GPU-hours (20.00 at PER_GPU_HOUR)."""
    return {
        "tenant": "protein-lab", "scenario": "ai-training", "gpu_model": "h100-80gb", "gpus": 2,
        "walltime_minutes": 60, "name": "budgeted", "script": SCRIPT,
    } | overrides  # fmt: skip


def job_request(tenant, scenario, gpu_model, partition, **fields) -> JobRequest:
    values = {"gpus": 2, "walltime_minutes": 60, "name": "budgeted"} | fields
    return JobRequest(tenant=tenant, scenario=scenario, gpu_model=gpu_model, script=SCRIPT,
                      cluster=partition.cluster, partition=partition.name, **values)  # fmt: skip
