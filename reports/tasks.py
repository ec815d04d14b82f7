"""The reports' periodic tasks (docs/periodic-tasks.md)."""

from celery import shared_task

from reports.statements import statements_make_due as make_due

# --- Statements


@shared_task(acks_late=True, soft_time_limit=1500, time_limit=1800)
def statements_make_due() -> dict[str, int]:
    """Beat, daily at STATEMENT_HOUR (the 1st makes them; a later day makes up a missed 1st):
    last month's statement of every tenant that had jobs or has a monthly budget, made once (kept
    as made), then mailed to its owners once (mailed_at). Safe to run again."""
    return make_due()
