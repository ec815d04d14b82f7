"""`{% load money %}` … `{{ amount|money }}`: an amount as billing.money shows it (the site's
currency, rounded half to even, in the page's language). Pages never round money themselves."""

from django import template

from billing import money as shown

register = template.Library()


@register.filter
def money(amount) -> str:
    return shown.as_text(amount)
