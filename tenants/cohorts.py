"""Cohorts: tenants that lend each other the idle GPUs of their grants for one GPU model
(jobs/services/lending.py makes and reclaims the loans). Who sees which cohort and which of its
members, and every write about them, each audited. Platform admins write; the API checks that
before it calls a service here."""

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Prefetch, Q, QuerySet

from clusters.models import GpuModel, Partition
from portal.core.errors import Conflict, Invalid, NotFound
from portal.core.services import audit_record
from portal.core.staff import sees_all_tenants
from tenants.models import Cohort, CohortMember, Tenant
from tenants.selectors import tenant_id_list_visible_to

# --- Reads


def cohorts_visible_to(*, user: AbstractBaseUser) -> QuerySet[Cohort]:
    """Staff who see every tenant: every cohort, with all its members. Anyone else: the cohorts
    that one of their tenants is a member of, each with only their own tenants' places, so that
    the other members are never named to them. Members by tenant slug; two queries a page."""
    members = CohortMember.objects.select_related("tenant").order_by("tenant__slug")
    cohorts = Cohort.objects.select_related("gpu_model", "partition__cluster")
    if not sees_all_tenants(user):  # the role decides; is_staff is only the console switch
        visible = tenant_id_list_visible_to(user=user)
        members = members.filter(tenant_id__in=visible)
        cohorts = cohorts.filter(
            id__in=CohortMember.objects.filter(tenant_id__in=visible).values("cohort_id")
        )
    return cohorts.prefetch_related(Prefetch("members", queryset=members))


def _overlap_of(
    *, tenant_ids: list[int], gpu_model_id: int, partition_id: int | None, cohort_id: int | None
) -> CohortMember | None:
    """A place of one of these tenants in another cohort of the same GPU model whose partitions
    meet this one's (either covers every partition, or both name the same). Lending reads one
    place per tenant and partition (lending_pool), so two such places are refused."""
    places = CohortMember.objects.filter(tenant_id__in=tenant_ids, cohort__gpu_model_id=gpu_model_id)
    if cohort_id is not None:
        places = places.exclude(cohort_id=cohort_id)
    if partition_id is not None:
        places = places.filter(Q(cohort__partition__isnull=True) | Q(cohort__partition_id=partition_id))
    return places.select_related("tenant", "cohort").order_by("tenant__slug", "cohort__slug").first()


def _require_no_overlap(**where) -> None:
    place = _overlap_of(**where)
    if place is not None:
        raise Conflict(
            f"{place.tenant.slug} is already in cohort {place.cohort.slug} of the same GPU model on an "
            "overlapping partition: a tenant lends and borrows in one cohort per partition."
        )


def _check_partition(gpu_model: GpuModel, partition: Partition | None) -> None:
    if partition is not None and partition.gpu_model_id != gpu_model.pk:
        raise Invalid({"partition": f"{partition} is not a partition of {gpu_model.slug}."})


def _partition_label(partition: Partition | None) -> str | None:
    return None if partition is None else f"{partition.cluster.slug}/{partition.name}"


def _lock(cohort: Cohort) -> Cohort:
    # Serializes the writes of one cohort: a member set twice at once is created once, and a
    # partition change sees every member that joins meanwhile.
    related = Cohort.objects.select_related("gpu_model", "partition__cluster")
    return related.select_for_update(of=("self",)).get(pk=cohort.pk)


def _lock_tenants(tenant_ids) -> list[Tenant]:
    # Two cohorts taking in the same tenant at once would each miss the other's place: the
    # tenant's row, locked in id order, makes the second wait and then see the first.
    return list(Tenant.objects.select_for_update(no_key=True).filter(pk__in=tenant_ids).order_by("pk"))


def _audit_members(*, actor, action: str, cohort: Cohort, tenants: list[Tenant], data: dict) -> None:
    """One event in each member tenant's audit log, or one of the platform's when none."""
    for tenant in tenants or [None]:
        audit_record(actor=actor, action=action, target=cohort, tenant=tenant, data=data)


# --- Writes


@transaction.atomic
def cohort_create(
    *,
    actor: AbstractBaseUser,
    slug: str,
    gpu_model: GpuModel,
    name: str = "",
    partition: Partition | None = None,
    reclaim_grace_s: int = 300,
) -> Cohort:
    """A cohort without members: nobody lends or borrows until members are set."""
    _check_partition(gpu_model, partition)
    if Cohort.objects.filter(slug=slug).exists():
        raise Invalid({"slug": "A cohort with this slug exists."})
    cohort = Cohort(
        slug=slug, name=name, gpu_model=gpu_model, partition=partition, reclaim_grace_s=reclaim_grace_s
    )
    cohort.full_clean(validate_unique=False)
    try:
        with transaction.atomic():
            cohort.save()
    except IntegrityError:  # the same slug created meanwhile
        raise Invalid({"slug": "A cohort with this slug exists."}) from None
    data = {"gpu_model": gpu_model.slug, "partition": _partition_label(partition)}
    audit_record(actor=actor, action="cohort.create", target=cohort, data=data | {"slug": slug})
    return cohort


# What a cohort's change may set: its slug and GPU model stay.
COHORT_FIELDS = ("name", "partition", "reclaim_grace_s")


@transaction.atomic
def cohort_update(*, actor: AbstractBaseUser, cohort: Cohort, changes: dict) -> Cohort:
    """Change name, partition or reclaim grace (slug and GPU model stay). A new partition must
    be of the cohort's GPU model, and may not make a member's places overlap."""
    if unknown := set(changes) - set(COHORT_FIELDS):
        raise ValueError(f"a cohort's {sorted(unknown)} do not change")
    cohort = _lock(cohort)
    before = {field: getattr(cohort, field) for field in changes}
    tenants = _lock_tenants(cohort.members.values("tenant_id"))
    if "partition" in changes and changes["partition"] != cohort.partition:
        _check_partition(cohort.gpu_model, changes["partition"])
        partition_id = changes["partition"].pk if changes["partition"] is not None else None
        _require_no_overlap(
            tenant_ids=[t.pk for t in tenants],
            gpu_model_id=cohort.gpu_model_id,
            partition_id=partition_id,
            cohort_id=cohort.pk,
        )
    for field, value in changes.items():
        setattr(cohort, field, value)
    if not changes:
        return cohort
    cohort.full_clean(validate_unique=False)
    cohort.save(update_fields=list(changes))
    shown = {field: _partition_label(v) if field == "partition" else v for field, v in before.items()}
    changed = {
        field: [shown[field], _partition_label(value) if field == "partition" else value]
        for field, value in changes.items()
        if before[field] != value
    }
    if changed:
        _audit_members(actor=actor, action="cohort.update", cohort=cohort, tenants=tenants, data=changed)
    return cohort


@transaction.atomic
def cohort_delete(*, actor: AbstractBaseUser, cohort: Cohort) -> None:
    """Delete the cohort and its members' places. A cohort with open loans is kept (Conflict):
    removing its members stops its lending, and its loans end with their jobs. Ended loans stay
    on record without their cohort."""
    cohort = _lock(cohort)
    if cohort.loans.filter(ended_at__isnull=True).exists():  # jobs.Loan, by its relation's name
        raise Conflict(
            f"Cohort {cohort.slug} has open loans; remove its members to stop its lending, and delete it "
            "once their jobs have ended."
        )
    tenants = list(Tenant.objects.filter(cohort_places__cohort=cohort).order_by("pk"))
    _audit_members(
        actor=actor, action="cohort.delete", cohort=cohort, tenants=tenants, data={"slug": cohort.slug}
    )
    cohort.delete()


@transaction.atomic
def cohort_member_set(
    *, actor: AbstractBaseUser, cohort: Cohort, tenant: Tenant, lending_limit: int, borrowing_limit: int
) -> tuple[CohortMember, bool]:
    """The tenant's place in the cohort with these limits, made (True) or changed (False). A new
    member may not be in another cohort of the same GPU model on an overlapping partition.
    Limits lowered below what is lent or borrowed now end no loan: they bound the next ones."""
    cohort = _lock(cohort)
    _lock_tenants([tenant.pk])
    member = CohortMember.objects.filter(cohort=cohort, tenant=tenant).first()
    created = member is None
    limits = {"lending_limit": lending_limit, "borrowing_limit": borrowing_limit}
    if created:
        _require_no_overlap(
            tenant_ids=[tenant.pk],
            gpu_model_id=cohort.gpu_model_id,
            partition_id=cohort.partition_id,
            cohort_id=cohort.pk,
        )
        member = CohortMember.objects.create(cohort=cohort, tenant=tenant, **limits)
        before = None
    else:
        before = {field: getattr(member, field) for field in limits}
        if before == limits:
            return member, False
        for field, value in limits.items():
            setattr(member, field, value)
        member.save(update_fields=list(limits))
    audit_record(
        actor=actor,
        action="cohort.member.set",
        target=member,
        tenant=tenant,
        data={"cohort": cohort.slug, "created": created, **limits, "before": before},
    )
    return member, created


@transaction.atomic
def cohort_member_remove(*, actor: AbstractBaseUser, member: CohortMember) -> None:
    """The tenant leaves the cohort: it lends and borrows no more there. Loans open now run on
    until their jobs end or are reclaimed."""
    cohort = _lock(member.cohort)
    if not CohortMember.objects.filter(pk=member.pk).exists():
        raise NotFound(f"{member.tenant.slug} is no longer a member of {cohort.slug}.")
    audit_record(
        actor=actor,
        action="cohort.member.remove",
        target=member,
        tenant=member.tenant,
        data={
            "cohort": cohort.slug,
            "lending_limit": member.lending_limit,
            "borrowing_limit": member.borrowing_limit,
        },
    )
    CohortMember.objects.filter(pk=member.pk).delete()
