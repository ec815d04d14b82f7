"""The suite's wait for something outside the test's thread (a worker, a scheduler, a process):
poll until it holds, with a deadline. No Django needed."""

import time


def wait_until(check, *, timeout_s: float, interval_s: float = 0.2, what: str = "condition"):
    """check() every interval_s until it returns something true, which is returned; past timeout_s
    an AssertionError that names `what` and check()'s last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s}s (last: {value!r})")
        time.sleep(interval_s)
