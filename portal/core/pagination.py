from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination

MAX_PAGE_SIZE = 200


class CursorPage(CursorPagination):
    """Cursor pagination on a unique, indexed key (API.md: `?page_size=` up to 200).

    DRF quietly ignores a bad page_size or answers 404 to a bad cursor; a client is better
    served by a 400 that names the parameter."""

    ordering = "-id"
    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE

    def get_page_size(self, request):
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_PAGE_SIZE:
            raise ValidationError({"page_size": [f"Must be a whole number from 1 to {MAX_PAGE_SIZE}."]})
        return int(raw)

    def decode_cursor(self, request):
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise ValidationError(
                {"cursor": ["Invalid cursor: use the next or previous link as given."]}
            ) from None
