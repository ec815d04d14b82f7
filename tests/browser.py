"""Headless Chromium (Debian's package) driven by Playwright, for page tests.

Playwright's own browser download cannot run here; Debian's chromium at /usr/bin/chromium can.
Screenshots go under artifacts/ (ARTIFACTS_DIR), one per page a test visits."""

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from django.db import connections
from playwright.sync_api import Page, sync_playwright

from tests.factories import PASSWORD

# Playwright's sync API runs an event loop in this thread; the ORM calls of a test happen
# before and after it, never inside a request, so the guard has nothing to protect here.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

WAIT_MS = 30_000  # every wait on a page for a job's progress is bounded

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("ARTIFACTS_DIR", Path(__file__).resolve().parent.parent / "artifacts"))
# Without the background-networking flags Chromium keeps dialling Google's hosts, which this
# machine's closed network refuses.
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def browser_page(*, locale: str = "en-US") -> Iterator[Page]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            context = browser.new_context(locale=locale, viewport={"width": 1366, "height": 768})
            page = context.new_page()
            page.set_default_timeout(15_000)
            yield page
        finally:
            browser.close()


def screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def outside_the_browser(fn, *args, **kwargs):
    """Run a Django call (the ORM, the API client) while Playwright drives the page: in a thread
    of its own that closes its connection. Inside Playwright's greenlet Django would open a
    connection of that greenlet's context, which nothing closes and which blocks the test
    database's teardown."""

    def run():
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result(timeout=60)


def log_in(page: Page, base: str, username: str, *, lands_on: str = "/t/protein-lab/") -> None:
    page.goto(f"{base}/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{base}{lands_on}")


def mark_document(page: Page) -> None:
    """A flag that a reload would wipe: proof that what follows changed in place."""
    page.evaluate("window.__sameDocument = true")


def assert_same_document(page: Page) -> None:
    assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
