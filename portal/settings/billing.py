"""Money: the site's currency, and when statements are made (docs/cost-model.md)."""

from babel.numbers import UnknownCurrencyError, get_currency_name
from django.core.exceptions import ImproperlyConfigured

from portal.envvars import env_int, env_str

# The ISO 4217 code every price, budget and statement is in (CNY, USD, EUR, …). One per site:
# changing it relabels the figures, it converts nothing.
PORTAL_CURRENCY = env_str("PORTAL_CURRENCY", "CNY").upper()
try:
    get_currency_name(PORTAL_CURRENCY, locale="en")
except UnknownCurrencyError as error:
    raise ImproperlyConfigured(f"PORTAL_CURRENCY: {PORTAL_CURRENCY!r} is not an ISO 4217 code") from error

# Beat makes last month's statements on the 1st at this hour, site time (TIME_ZONE).
STATEMENT_HOUR = env_int("STATEMENT_HOUR", 1, minimum=0, maximum=23)
# How often beat looks at budgets for the 50/80/100 % notices (they are also looked at on submit).
BUDGET_CHECK_INTERVAL_S = env_int("BUDGET_CHECK_INTERVAL_S", 900, minimum=60, maximum=86400)
