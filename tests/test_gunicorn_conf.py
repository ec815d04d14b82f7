"""gunicorn.conf.py: the worker's start-up hook freezes what Django loaded, views included, so
that the garbage collector's full passes no longer walk it during requests."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import gc, runpy, sys
import django
django.setup()
conf = runpy.run_path("gunicorn.conf.py")
assert "jobs.api" not in sys.modules
conf["post_worker_init"](None)
print("jobs.api" in sys.modules, gc.get_freeze_count())
"""


def test_a_worker_freezes_django_with_its_views_loaded():
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    views_loaded, frozen = done.stdout.split()
    assert views_loaded == "True"
    assert int(frozen) > 50_000  # Django, DRF and the portal's modules, not a handful
