"""gunicorn.conf.py: the worker's start-up hook freezes what Django loaded, views included, so
that the garbage collector's full passes no longer walk it during requests; and the answer to a
request gunicorn itself cannot parse is problem+json."""

import json
import socket
import subprocess
import sys

from tests.conftest import ROOT, VENV_BIN, free_port, stop, wait_for_port

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


def test_gunicorn_answers_a_request_it_cannot_parse_with_problem_json():
    """Gunicorn refuses a request line over 4094 bytes itself, before Django; gunicorn.conf.py,
    which every gunicorn of the project reads, makes that answer problem+json too."""
    port = free_port()
    proc = subprocess.Popen(
        [str(VENV_BIN / "gunicorn"), "portal.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, timeout_s=30, proc=proc)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(f"GET /api/v1/me/?x={'a' * 6000} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
    finally:
        stop(proc)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert b"Content-Type: application/problem+json" in head
    problem = json.loads(body)
    assert problem["code"] == "invalid" and problem["status"] == 400 and "too large" in problem["detail"]
