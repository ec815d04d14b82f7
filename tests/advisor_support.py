"""What the sizing advisor's tests share: the seeded models in a scenario's rank order, and one
model's option of an advice."""

from clusters import advisor
from clusters.models import GpuModel, ScenarioGpu


def ranked(slug: str) -> list[GpuModel]:
    entries = ScenarioGpu.objects.filter(scenario__slug=slug).select_related("gpu_model").order_by("rank")
    return [e.gpu_model for e in entries]


def option(advice: advisor.Advice, slug: str) -> advisor.Option:
    return next(o for o in advice.options if o.gpu_model == slug)
