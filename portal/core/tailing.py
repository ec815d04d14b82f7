"""Reading a table's new rows by id as they are committed (the event stream, the webhook scan).

An id is taken when a row is inserted and the row appears when its transaction commits, so a
reader that only asks for ids above the highest it has seen would pass over a row committed
after one with a higher id, for good. A reader keeps such ids as gaps and asks for them again
with its next reads, until the row appears or EVENTS_GAP_WAIT_S has passed (a rolled-back
insert leaves a gap that never fills). Rows read late come after rows with higher ids: readers
tell them apart by id, never by order."""

import time

from django.conf import settings
from django.db.models import Q

MAX_GAPS = 1000  # ids waited for below a new highest one, at most


class IdTail:
    def __init__(self, position: int, gaps: dict[int, float] | None = None) -> None:
        self.position = position
        self.gaps = dict(gaps or {})

    def wanted(self) -> Q:
        """The rows to read next: above the position, and the gaps still waited for."""
        now = time.time()
        self.gaps = {pk: since for pk, since in self.gaps.items() if now - since < settings.EVENTS_GAP_WAIT_S}
        return Q(id__gt=self.position) | Q(id__in=list(self.gaps)) if self.gaps else Q(id__gt=self.position)

    def took(self, ids: list[int]) -> None:
        """The ids just read, in ascending order: gaps filled, new gaps below the highest noted."""
        now = time.time()
        for pk in ids:
            self.gaps.pop(pk, None)
            if pk > self.position:
                # the ids just below are the ones likely still in flight; of a larger jump (a
                # reader's first position below a sequence that ran on) only the last MAX_GAPS
                self.gaps.update(dict.fromkeys(range(max(self.position + 1, pk - MAX_GAPS), pk), now))
                self.position = pk
