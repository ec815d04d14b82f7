"""Conditional GETs (docs/api.md, Conditional requests): an `ETag` on the answers that clients
poll (a job, the job list, quota), and `304 Not Modified` to an `If-None-Match` that names it.

The tag is a digest of the rendered body: what the client would get, so a tag can never say
"unchanged" of an answer that changed (a tag kept beside the rows would have to be bumped by
every path that writes a job, and one missed path serves stale answers). A 304 saves the body's
bytes on the wire and the client's parsing; bench/conditional.py measures what it saves in the
web process. A 304 is not counted by the throttles: a client that asks again and learns that
nothing changed must not use up the allowance that its real work needs. The throttles of a
request that carries If-None-Match are checked once the answer is known not to be a 304, and a
refusal then replaces the answer; such requests count, 304s included, against a larger
allowance of their own (API_THROTTLE_CONDITIONAL), so that replaying a current tag is not an
unlimited way to make the portal run queries.

Tags compare weakly (RFC 9110 8.8.3.2): nginx's gzip turns a strong tag weak on the way out,
and the client sends back what it got."""

import hashlib

from django.utils.http import parse_etags, quote_etag
from rest_framework import status
from rest_framework.exceptions import Throttled
from rest_framework.response import Response

from portal.core.throttles import ConditionalThrottle

SAFE = ("GET", "HEAD")


def etag_of(body: bytes) -> str:
    """A quoted tag for an answer's body."""
    return quote_etag(hashlib.blake2b(body, digest_size=16).hexdigest())


def matches(request, etag: str) -> bool:
    """Whether If-None-Match names this tag. `*` is not honoured: on a GET it would make any
    answer a 304 that the user throttle does not count."""
    wanted = request.headers.get("If-None-Match", "")
    if not wanted:
        return False
    return etag.removeprefix("W/") in {tag.removeprefix("W/") for tag in parse_etags(wanted)}


class ConditionalGet:
    """For an APIView whose GET answers may be asked again with If-None-Match: every 200 GET gets
    an ETag, and a match a 304 that the throttles do not count."""

    _throttles_deferred = False

    def check_throttles(self, request):
        if request.method in SAFE and "If-None-Match" in request.headers:
            # Counted at once by their own, larger allowance; by the user's only if not a 304.
            conditional = ConditionalThrottle()
            if not conditional.allow_request(request, self):
                self.throttled(request, conditional.wait())
            self._throttles_deferred = True
            return
        super().check_throttles(request)

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        if request.method in SAFE and response.status_code == status.HTTP_200_OK:
            etag = etag_of(response.render().content)
            if matches(request, etag):
                unchanged = Response(status=status.HTTP_304_NOT_MODIFIED, headers={"ETag": etag})
                return super().finalize_response(request, unchanged, *args, **kwargs)
            response["ETag"] = etag
        if self._throttles_deferred:
            self._throttles_deferred = False
            try:
                super().check_throttles(request)
            except Throttled as exc:
                response = super().finalize_response(request, self.handle_exception(exc), *args, **kwargs)
        return response
