"""Headless Chromium (Debian's package) driven by Playwright, for page tests.

Playwright's own browser download cannot run here; Debian's chromium at /usr/bin/chromium can.
Screenshots go under artifacts/ (ARTIFACTS_DIR), one per page a test visits."""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

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
