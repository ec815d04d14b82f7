"""The API's JSON, written by orjson: the same bytes as DRF's JSONRenderer (compact, UTF-8,
U+2028 and U+2029 escaped, DRF's forms of datetimes, Decimals and the rest), several times
faster; a page of 50 jobs spent a tenth of its time in json.dumps (docs/performance.md).
tests/core/test_renderers.py holds the two renderers to the same bytes."""

import orjson
from rest_framework import renderers
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.utils.encoders import JSONEncoder

# What orjson would write its own way goes to DRF's encoder instead: datetimes (DRF writes Z and
# milliseconds), dataclasses and subclasses of str, int, dict and list (an enum member, say).
OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS
_drf = JSONEncoder()
LINE_SEPARATORS = (b"\xe2\x80\xa8", b"\xe2\x80\xa9")


def _default(value):
    """DRF's form of what orjson does not write itself; a dict or list subclass (DRF's
    ReturnDict, ReturnList) as the plain dict or list it is."""
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    if isinstance(value, str | int) and not isinstance(value, bool):
        return str(value) if isinstance(value, str) else int(value)
    return _drf.default(value)


class JSONRenderer(renderers.JSONRenderer):
    def render(self, data, accepted_media_type=None, renderer_context=None):
        if data is None:
            return b""
        if self.get_indent(accepted_media_type, renderer_context or {}) is not None:
            return super().render(data, accepted_media_type, renderer_context)  # asked for indentation
        try:
            out = orjson.dumps(data, default=_default, option=OPTIONS)
        except (TypeError, orjson.JSONEncodeError):
            # What orjson refuses and json writes or refuses in its own words: an int beyond 64
            # bits, a non-string key, NaN.
            return super().render(data, accepted_media_type, renderer_context)
        for raw in LINE_SEPARATORS:  # as DRF: JSON that is also a strict JavaScript subset
            if raw in out:
                out = out.replace(b"\xe2\x80\xa8", b"\\u2028").replace(b"\xe2\x80\xa9", b"\\u2029")
                break
        return out


# The Accept headers that every client of a JSON API sends, answered without DRF's parsing.
PLAIN_ACCEPTS = frozenset({"*/*", "application/json", "application/json, */*"})


class JsonNegotiation(DefaultContentNegotiation):
    """DRF's content negotiation, with its answer for the common case known in advance: a view
    whose one renderer writes JSON, an Accept header of PLAIN_ACCEPTS (or none), no ?format=.
    DRF's parses the header and matches it against the renderers on every request, a tenth of
    what DRF itself cost a job's answer. Anything else (another type, parameters, an empty
    header, another renderer or several) goes through DRF's own, so that 406 and `indent=` stay
    as DRF answers them."""

    def select_renderer(self, request, renderers, format_suffix=None):
        accept = request.META.get("HTTP_ACCEPT", "*/*")  # none: anything, as DRF reads it
        if (
            len(renderers) == 1
            and renderers[0].media_type == "application/json"
            and accept in PLAIN_ACCEPTS
            and not format_suffix
            and self.settings.URL_FORMAT_OVERRIDE not in request.query_params
        ):
            renderer = renderers[0]
            return renderer, renderer.media_type
        return super().select_renderer(request, renderers, format_suffix)
