"""A statement as a PDF, rendered on the server by WeasyPrint in the reader's language, with its
charts drawn here as inline SVG (no script runs in a PDF). WeasyPrint is imported when a PDF is
asked for: a server without Pango answers that one request 503, and serves everything else."""

from __future__ import annotations

from decimal import Decimal

from django.template.loader import render_to_string
from django.utils import translation
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

from portal.core.errors import Unavailable
from reports.models import Statement
from reports.statements import statement_view

LANGUAGES = ("en", "zh-hans")
# Latin first; Chinese names (users, scenarios, tenants) fall through to WenQuanYi, which Debian's
# fonts-wqy-microhei installs, then Noto CJK where that is the one installed.
FONTS = "'DejaVu Sans', 'WenQuanYi Micro Hei', 'Noto Sans CJK SC', 'Noto Sans SC', sans-serif"

BAR_COLOUR = "#2f6fbd"
ROW_H, LABEL_W, BAR_W, VALUE_W = 22, 170, 300, 120


def bar_chart_svg(rows: list[tuple[str, Decimal, str]], *, title: str) -> SafeString:
    """A horizontal bar chart: one (label, value, value as shown) per bar, the largest bar full
    width. Labels are escaped; the SVG is ours."""
    top = max((value for _, value, _ in rows), default=Decimal(0))
    height = 28 + ROW_H * max(1, len(rows))
    width = LABEL_W + BAR_W + VALUE_W
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
        f'<text x="0" y="14" font-size="12" font-weight="bold" font-family="{FONTS}">{escape(title)}</text>',
    ]
    for i, (label, value, shown) in enumerate(rows):
        y = 24 + i * ROW_H
        length = 0 if top <= 0 else max(1, int(BAR_W * value / top))
        parts += [
            f'<text x="0" y="{y + 14}" font-size="10" font-family="{FONTS}">{escape(label[:28])}</text>',
            f'<rect x="{LABEL_W}" y="{y + 3}" width="{length}" height="{ROW_H - 8}" fill="{BAR_COLOUR}"/>',
            f'<text x="{LABEL_W + length + 6}" y="{y + 14}" font-size="10" font-family="{FONTS}">'
            f"{escape(shown)}</text>",
        ]
    if not rows:
        nothing = escape(_("Nothing"))
        parts.append(
            f'<text x="0" y="38" font-size="10" fill="#57606a" font-family="{FONTS}">{nothing}</text>'
        )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 (every text in it is escaped above)


# The lines a PDF lists: WeasyPrint lays a long table out at about 10 ms a line (bench/cost.py:
# 6.4 s for 619), and a statement of thousands of lines would outlast the request. The totals,
# sums and charts cover every line; the CSV and XLSX list them all.
PDF_LINES = 150


def statement_html(statement: Statement, *, language: str) -> str:
    """The PDF's HTML in `language`: figures, tables and charts."""
    with translation.override(language):
        view = statement_view(statement, language=language)
        charts = {
            "by_gpu_model": bar_chart_svg(
                [(row["name"], row["cost"], row["cost_text"]) for row in view["by_gpu_model"]],
                title=_("Cost by GPU model"),
            ),
            "by_user": bar_chart_svg(
                [(row["name"], row["cost"], row["cost_text"]) for row in view["by_user"]],
                title=_("Cost by user"),
            ),
        }
        lines = view["lines"][:PDF_LINES]
        return render_to_string(
            "reports/statement_pdf.html",
            {
                "statement": statement, "view": view, "charts": charts, "fonts": FONTS, "language": language,
                "lines": lines, "lines_left": len(view["lines"]) - len(lines),
            },
        )  # fmt: skip


def statement_pdf(statement: Statement, *, language: str) -> bytes:
    """The statement as a PDF in `language`. Unavailable (503) where WeasyPrint cannot load."""
    try:
        from weasyprint import HTML  # here: needs Pango; without it only this request fails
    except (ImportError, OSError) as error:
        raise Unavailable(
            "PDF statements are not available on this server: WeasyPrint cannot load its libraries "
            "(Pango). The statement's page, CSV and XLSX are."
        ) from error
    # Nothing is fetched while rendering: the page carries its styles and charts inline, fonts
    # come from fontconfig, and a name in a statement (its users' and jobs' text) that looked
    # like a URL must never make the server read a file or call an address.
    return HTML(
        string=statement_html(statement, language=language), base_url=None, url_fetcher=refuse_fetch
    ).write_pdf()


def refuse_fetch(url: str, *args, **kwargs):
    raise ValueError(f"a statement's PDF fetches nothing ({url[:80]!r} refused)")
