from datetime import timedelta
from decimal import Decimal

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from clusters.models import Cluster, ClusterKind, Partition
from jobs.models import Job, Loan
from tenants.models import Cohort, CohortMember, Membership, QuotaGrant, QuotaRequest, Role, Tenant

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


class _QuotaFactory(factory.django.DjangoModelFactory):
    """What a grant and a request share: a tenant, a (scenario, GPU model) pair, the catalog's
    (ai-training, H100-80GB: the `catalog` fixture) unless told otherwise, and `days` from today."""

    class Meta:
        abstract = True

    class Params:
        pair = factory.LazyFunction(lambda: catalog_pair())
        days = 30

    tenant = factory.SubFactory(TenantFactory)
    scenario = factory.LazyAttribute(lambda q: q.pair[0])
    gpu_model = factory.LazyAttribute(lambda q: q.pair[1])
    starts_on = factory.LazyFunction(timezone.localdate)
    ends_on = factory.LazyAttribute(lambda q: q.starts_on + timedelta(days=q.days))

    @classmethod
    def _adjust_kwargs(cls, **kwargs):
        # The figures as the database hands them back: gpu_hours=10 reads as Decimal(10).
        for name in ("gpu_hours", "gpu_hours_reserved", "gpu_hours_used"):
            if name in kwargs:
                kwargs[name] = Decimal(str(kwargs[name]))
        return kwargs


class QuotaGrantFactory(_QuotaFactory):
    """An active grant: 4 GPUs at once and 100 GPU-hours for 30 days."""

    class Meta:
        model = QuotaGrant

    gpus = 4
    gpu_hours = Decimal(100)


class QuotaRequestFactory(_QuotaFactory):
    """A pending request for 8 GPUs at once and 500 GPU-hours for 60 days."""

    class Meta:
        model = QuotaRequest

    class Params:
        days = 60

    gpus = 8
    gpu_hours = Decimal(500)
    justification = "Protein LM"


class ClusterFactory(factory.django.DjangoModelFactory):
    """A healthy local cluster of 8 GPUs; slurm and kubernetes ones take their connection fields."""

    class Meta:
        model = Cluster

    slug = factory.Sequence(lambda n: f"cluster-{n}")
    name = factory.LazyAttribute(lambda c: c.slug.title())
    kind = ClusterKind.LOCAL
    local_gpus = factory.LazyAttribute(lambda c: 8 if c.kind == ClusterKind.LOCAL else 0)
    healthy = True


class PartitionFactory(factory.django.DjangoModelFactory):
    """One node of 8 GPUs of the catalog's H100-80GB, jobs of up to 10 hours, on a cluster of its own."""

    class Meta:
        model = Partition

    cluster = factory.SubFactory(ClusterFactory)
    name = "local"
    gpu_model = factory.LazyFunction(lambda: catalog_pair()[1])
    gpus_per_node = 8
    nodes = 1
    max_walltime_minutes = 600


class JobFactory(factory.django.DjangoModelFactory):
    """A QUEUED job row of 1 GPU for 10 minutes under `grant` on `partition`, written straight into
    the database (no service: the grant's ledger is left as it is); it reserves GPUs × walltime."""

    class Meta:
        model = Job

    grant = factory.SubFactory(QuotaGrantFactory)
    tenant = factory.LazyAttribute(lambda j: j.grant.tenant)
    scenario = factory.LazyAttribute(lambda j: j.grant.scenario)
    gpu_model = factory.LazyAttribute(lambda j: j.grant.gpu_model)
    partition = factory.SubFactory(PartitionFactory, gpu_model=factory.SelfAttribute("..gpu_model"))
    cluster = factory.LazyAttribute(lambda j: j.partition.cluster)
    submitted_by = factory.SubFactory(UserFactory)
    name = "j"
    gpus = 1
    walltime_minutes = 10
    cpus_per_gpu = 1
    mem_per_gpu_mb = 100
    script = "#!/bin/bash\n"
    reserved_gpu_hours = factory.LazyAttribute(
        lambda j: (Decimal(j.gpus * j.walltime_minutes) / 60).quantize(Decimal("0.01"))
    )


def seed_catalog() -> None:
    """The catalog as the migrations write it (0002's models and scenarios, 0010's shares and the
    Ascend 910B), again where a transactional test elsewhere flushed it; idempotent."""
    import importlib

    from django.apps import apps

    importlib.import_module("clusters.migrations.0002_seed_catalog").seed(apps, None)
    importlib.import_module("clusters.migrations.0010_share_catalog").forward(apps, None)


def catalog_pair(scenario_slug: str = "ai-training", gpu_slug: str = "h100-80gb"):
    """A scenario and a GPU model it lists, from the catalog seed (re-seeded when a transactional
    test elsewhere flushed it)."""

    from django.db.models import Max

    from clusters.models import GpuModel, Scenario, ScenarioGpu

    if not GpuModel.objects.exists():
        seed_catalog()

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


def staff_user(username: str, *roles: str):
    """A staff account in the documented role groups named (portal.core.staff: "Read-only
    support", "Quota approver", "Platform admin"); none: staff without a role."""
    from django.contrib.auth.models import Group

    user = UserFactory(username=username, is_staff=True)
    user.groups.set(Group.objects.filter(name__in=roles))
    return user


class CohortFactory(factory.django.DjangoModelFactory):
    """A cohort of the catalog's H100-80GB on every partition, without members."""

    class Meta:
        model = Cohort

    slug = factory.Sequence(lambda n: f"cohort-{n}")
    name = factory.LazyAttribute(lambda c: c.slug.title())
    gpu_model = factory.LazyFunction(lambda: catalog_pair()[1])
    partition = None


class CohortMemberFactory(factory.django.DjangoModelFactory):
    """A tenant's place in a cohort, lending and borrowing up to 4 GPUs."""

    class Meta:
        model = CohortMember

    cohort = factory.SubFactory(CohortFactory)
    tenant = factory.SubFactory(TenantFactory)
    lending_limit = 4
    borrowing_limit = 4


class LoanFactory(factory.django.DjangoModelFactory):
    """An open loan of 1 GPU of `lender_grant` to `job` (of another tenant) in `cohort`, started an
    hour ago; written straight into the database (no grant's ledger moves)."""

    class Meta:
        model = Loan

    cohort = factory.SubFactory(CohortFactory)
    job = factory.SubFactory(JobFactory)
    borrower = factory.LazyAttribute(lambda loan: loan.job.tenant)
    lender_grant = factory.SubFactory(QuotaGrantFactory)
    lender = factory.LazyAttribute(lambda loan: loan.lender_grant.tenant)
    gpus = 1
    started_at = factory.LazyFunction(lambda: timezone.now() - timedelta(hours=1))
