"""The alert panels that the tenant's dashboard and a job's page show ({% load alerts %}): the
pages belong to the jobs app, which imports nothing of monitoring, so the panels come as tags."""

from django import template

from monitoring.selectors import alerts_firing_of, alerts_of_job

register = template.Library()

PANEL_ALERTS = 20  # the most a panel lists, newest first


@register.inclusion_tag("monitoring/_alerts.html", takes_context=True)
def tenant_alerts(context, tenant):
    """The tenant's firing alerts, for its dashboard (the view has found the tenant visible)."""
    alerts = alerts_firing_of(user=context["request"].user, tenant=tenant).order_by("-starts_at")
    return {"alerts": list(alerts[:PANEL_ALERTS]), "for_job": False, "tenant": tenant}


@register.inclusion_tag("monitoring/_alerts.html", takes_context=True)
def job_alerts(context, job):
    """Every alert about the job, firing or resolved, for its page."""
    alerts = alerts_of_job(user=context["request"].user, job_id=job.pk).order_by("-starts_at")
    return {"alerts": list(alerts[:PANEL_ALERTS]), "for_job": True, "tenant": context.get("tenant")}
