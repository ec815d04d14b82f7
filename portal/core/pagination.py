import re

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.utils.urls import replace_query_param

MAX_PAGE_SIZE = 200
_PAGE_SIZE_RE = re.compile(r"[0-9]{1,3}")
# DRF's offset cutoff: a cursor never skips more rows than this past its position.
MAX_OFFSET = CursorPagination.offset_cutoff


class CursorPage(CursorPagination):
    """Cursor pagination on a unique, indexed key (docs/api.md: `?page_size=` up to 200).

    DRF quietly ignores a bad page_size or answers 404 to a bad cursor; a client is better
    served by a 400 that names the parameter.

    The cursor reads `<offset>.<reverse>.<position>` (DRF's own is the same triple in base64).
    Its form is the schema's pattern, and every string of that form is a cursor the list
    answers: a position is only ever compared with the ordering key, so it need not exist. A
    position that the key's column cannot hold (DRF decodes any text) would fail in the
    database, so the pattern also fixes the position's form, per ordering key."""

    ordering = "-id"
    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE
    # The ordering key's values as text: positive integers here, slugs in BySlug.
    position_pattern = r"[0-9]{1,18}"
    cursor_query_description = "The `next` or `previous` link's cursor, as given."
    page_size_query_description = f"Rows per page, 1 to {MAX_PAGE_SIZE}."

    @classmethod
    def cursor_pattern(cls) -> str:
        # Plain groups: the schema's regex dialect (ECMA 262) has no (?P<name>).
        return rf"^([0-9]{{1,4}})\.([01])\.({cls.position_pattern})?$"

    def get_page_size(self, request):
        raw = request.query_params.get(self.page_size_query_param)
        if not raw:  # absent, or empty as any optional parameter may be
            return self.page_size
        # Not str.isdigit(): it holds for "²", which int() refuses.
        if _PAGE_SIZE_RE.fullmatch(raw) is None or not 1 <= int(raw) <= MAX_PAGE_SIZE:
            raise ValidationError({"page_size": [f"Must be a whole number from 1 to {MAX_PAGE_SIZE}."]})
        return int(raw)

    def encode_cursor(self, cursor: Cursor) -> str:
        position = "" if cursor.position is None else cursor.position
        token = f"{cursor.offset}.{int(cursor.reverse)}.{position}"
        return replace_query_param(self.base_url, self.cursor_query_param, token)

    def decode_cursor(self, request) -> Cursor | None:
        raw = request.query_params.get(self.cursor_query_param)
        if not raw:
            return None
        match = re.fullmatch(self.cursor_pattern(), raw)
        if match is None:
            raise ValidationError({"cursor": ["Invalid cursor: use the next or previous link as given."]})
        return Cursor(
            offset=min(int(match[1]), MAX_OFFSET),
            reverse=match[2] == "1",
            position=match[3],
        )

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.cursor_query_param:
                parameter["schema"] = {"type": "string", "pattern": self.cursor_pattern()}
            elif parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_SIZE}
        return parameters
