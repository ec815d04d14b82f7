"""A tenant's budgets set, changed and removed (billing/models.py, Budget), each audited. What a
budget has spent reads jobs, so it is jobs/budgets.py's."""

from decimal import Decimal

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction

from billing.models import Budget, BudgetPeriod
from portal.core.errors import Conflict, Invalid
from portal.core.services import audit_record
from tenants.models import QuotaGrant, Tenant


def _grant_of(tenant: Tenant, period: str, grant_id: int | None) -> QuotaGrant | None:
    """The tenant's grant a budget per grant names; a 400 naming `grant` otherwise."""
    if period == BudgetPeriod.MONTH:
        if grant_id is not None:
            raise Invalid({"grant": "A monthly budget names no grant."})
        return None
    if grant_id is None:
        raise Invalid({"grant": "A budget per grant names its grant."})
    grant = QuotaGrant.objects.filter(tenant=tenant, pk=grant_id).first()
    if grant is None:
        raise Invalid({"grant": f"{tenant.slug} has no grant {grant_id}."})
    return grant


def budget_create(
    *,
    actor: AbstractBaseUser | None,
    tenant: Tenant,
    period: str,
    amount: Decimal,
    hard: bool = False,
    grant_id: int | None = None,
) -> Budget:
    """A new budget of the tenant: one per month, or one per grant. A second one of the same
    kind is a 409 conflict (change the first instead)."""
    grant = _grant_of(tenant, period, grant_id)
    try:
        with transaction.atomic():
            budget = Budget.objects.create(
                tenant=tenant, period=period, grant=grant, amount=amount, hard=hard
            )
            data = {"period": period, "grant": grant_id, "amount": str(amount), "hard": hard}
            audit_record(actor=actor, action="budget.create", target=budget, tenant=tenant, data=data)
    except IntegrityError:
        which = "a monthly budget" if grant is None else f"a budget for grant {grant.pk}"
        raise Conflict(f"{tenant.slug} already has {which}: change it instead.") from None
    return budget


def budget_change(*, actor: AbstractBaseUser | None, budget: Budget, **fields) -> Budget:
    """Change its amount or hardness (those given); its period and grant stay: a budget of
    another kind is a new budget."""
    changed = sorted(name for name, value in fields.items() if getattr(budget, name) != value)
    with transaction.atomic():
        # The row lock that a submission's budget check takes: a change waits for it.
        budget = Budget.objects.select_for_update().select_related("tenant").get(pk=budget.pk)
        for name, value in fields.items():
            setattr(budget, name, value)
        budget.save()
        data = {"changed": changed, "amount": str(budget.amount), "hard": budget.hard}
        audit_record(actor=actor, action="budget.change", target=budget, tenant=budget.tenant, data=data)
    return budget


def budget_delete(*, actor: AbstractBaseUser | None, budget: Budget) -> None:
    with transaction.atomic():
        data = {"period": budget.period, "grant": budget.grant_id, "amount": str(budget.amount)}
        audit_record(actor=actor, action="budget.delete", target=budget, tenant=budget.tenant, data=data)
        budget.delete()


def budget_set(
    *,
    actor: AbstractBaseUser | None,
    tenant: Tenant,
    amount: Decimal,
    hard: bool,
    grant_id: int | None = None,
) -> Budget:
    """The budget page's one form: the tenant's monthly budget (or the grant's) changed to these
    figures, or made when it has none."""
    period = BudgetPeriod.MONTH if grant_id is None else BudgetPeriod.GRANT
    budget = Budget.objects.filter(tenant=tenant, period=period, grant_id=grant_id).first()
    if budget is None:
        return budget_create(actor=actor, tenant=tenant, period=period, amount=amount, hard=hard,
                             grant_id=grant_id)  # fmt: skip
    return budget_change(actor=actor, budget=budget, amount=amount, hard=hard)
