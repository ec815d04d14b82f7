"""Money as it is shown: the site's currency (PORTAL_CURRENCY), rounded only here, half to even
(banker's rounding), to the currency's minor unit; formatted for the reader's language by Babel."""

from decimal import ROUND_HALF_EVEN, Decimal

from babel.numbers import format_currency, get_currency_precision
from django.conf import settings
from django.utils.translation import get_language, to_locale


def currency() -> str:
    return settings.PORTAL_CURRENCY


def rounded(amount: Decimal) -> Decimal:
    """An amount rounded to the currency's minor unit (2 places for CNY, USD, EUR; 0 for JPY)."""
    places = get_currency_precision(currency())
    return amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_EVEN)


def as_text(amount: Decimal | None, language: str | None = None) -> str:
    """`¥1,234.50` in zh_Hans, `CN¥1,234.50` in English; "" for None."""
    if amount is None:
        return ""
    locale = to_locale(language or get_language() or settings.LANGUAGE_CODE)
    return format_currency(rounded(amount), currency(), locale=locale, decimal_quantization=True)


def as_api(amount: Decimal | None) -> str | None:
    """An amount in the API: a decimal string rounded to the minor unit, as Stripe and Waldur
    give money (never a float)."""
    return None if amount is None else str(rounded(amount))
