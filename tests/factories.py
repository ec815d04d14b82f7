import factory
from django.contrib.auth import get_user_model

from tenants.models import Membership, Role, Tenant

PASSWORD = "correct horse battery staple"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ["username"]
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.org")
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def _save(obj, create, extracted, **kwargs):
        if create:
            obj.save()


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant

    slug = factory.Sequence(lambda n: f"team-{n}")
    name = factory.LazyAttribute(lambda t: t.slug.replace("-", " ").title())
    contact_email = factory.LazyAttribute(lambda t: f"{t.slug}@example.org")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    tenant = factory.SubFactory(TenantFactory)
    role = Role.MEMBER


def catalog_pair(scenario_slug: str = "ai-training", gpu_slug: str = "h100-80gb"):
    """A scenario and a GPU model it lists, from the catalog seed (re-seeded when a transactional
    test elsewhere flushed it)."""
    import importlib

    from django.apps import apps
    from django.db.models import Max

    from clusters.models import GpuModel, Scenario, ScenarioGpu

    if not GpuModel.objects.exists():
        importlib.import_module("clusters.migrations.0002_seed_catalog").seed(apps, None)

    scenario, _ = Scenario.objects.get_or_create(
        slug=scenario_slug,
        defaults={"name": scenario_slug, "description": "test", "default_walltime_minutes": 60},
    )
    gpu_model, _ = GpuModel.objects.get_or_create(
        slug=gpu_slug,
        defaults={
            "vendor": "nvidia", "name": gpu_slug.upper(), "memory_gb": 80, "fp64_tflops": 34, "fp32_tflops": 67,
            "fp16_tflops": 990, "memory_bandwidth_gbs": 3350, "interconnect": "NVLink 4", "interconnect_gbs": 900,
            "ecc": True, "cost_index": 100, "slurm_gres": "h100", "k8s_resource": "nvidia.com/gpu",
            "k8s_product": "NVIDIA-H100-80GB-HBM3",
        },
    )  # fmt: skip
    if not ScenarioGpu.objects.filter(scenario=scenario, gpu_model=gpu_model).exists():
        top = ScenarioGpu.objects.filter(scenario=scenario).aggregate(top=Max("rank"))["top"] or 0
        ScenarioGpu.objects.create(scenario=scenario, gpu_model=gpu_model, rank=top + 1, reason="test")
    return scenario, gpu_model
