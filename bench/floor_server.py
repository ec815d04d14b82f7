"""The floor's gunicorn for bench/load.py's phases g and h (bench/floor_views.py), behind its own
nginx from the stack's config when the stack runs behind one."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import peers
from bench.rss import children_of

ROOT = Path(__file__).resolve().parent.parent


class FloorServer:
    """The floor's gunicorn on 127.0.0.1:port for the duration of a with block, with as many sync
    workers as the stack's gunicorn has (its master's pid in the stack dir)."""

    READY_S = 60.0

    def __init__(self, port: int, stack_dir: Path) -> None:
        self.port, self.stack_dir, self.proc, self.proxy = port, stack_dir, None, None

    MAX_WORKERS = 9  # each holds a database connection

    def workers(self) -> int:
        try:
            count = len(children_of(int((self.stack_dir / "web.pid").read_text())))
        except (OSError, ValueError):
            count = 2 * (os.cpu_count() or 1) + 1
        return min(self.MAX_WORKERS, max(1, count))

    def __enter__(self) -> str:
        url = f"http://127.0.0.1:{self.port}"
        probe = peers.LoopbackHttp(url, timeout_s=5)
        with contextlib.suppress(OSError):
            probe.request("GET", "/", {}, None)
            raise SystemExit(f"{url} already answers: the floor needs the port (--floor-port)")
        env = os.environ | {"DJANGO_SETTINGS_MODULE": "bench.floor_settings"}
        gunicorn = Path(sys.executable).with_name("gunicorn")
        bind = f"127.0.0.1:{self.port}"
        if (self.stack_dir / "proxy.pid").exists():  # the stack runs behind nginx: so does the floor
            bind = f"unix:{self.stack_dir / 'floor.sock'}"
            self.proxy = self._proxy(bind)
        with (self.stack_dir / "floor.log").open("ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [str(gunicorn), "portal.wsgi", "--bind", bind, "--workers", str(self.workers())],
                cwd=ROOT, env=env, stdout=log, stderr=log,
            )  # fmt: skip
        deadline = time.monotonic() + self.READY_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if probe.request("GET", "/api/v1/jobs/1/", {}, None)[0] == 401 and self.proc.poll() is None:
                    return url
            if self.proc.poll() is not None:
                log = self.stack_dir / "floor.log"
                raise SystemExit(f"the floor's gunicorn exited with {self.proc.returncode}; see {log}")
            time.sleep(0.2)
        self.__exit__()
        raise SystemExit(f"the floor's gunicorn did not answer on {url} within {self.READY_S:g} s")

    def _proxy(self, upstream: str) -> subprocess.Popen:
        """nginx from the stack's own config (deploy/nginx/portal.conf) on the floor's port."""
        folder = self.stack_dir / "floor-proxy"
        conf = subprocess.run(
            ["bash", "scripts/stack", "proxy-conf", f"127.0.0.1:{self.port}", upstream, str(folder)],
            cwd=ROOT, capture_output=True, text=True, check=True, timeout=30,
        ).stdout  # fmt: skip
        (folder / "nginx.conf").write_text(conf)
        if os.getuid() == 0:
            subprocess.run(["chown", "-R", "www-data", str(folder / "proxy-tmp")], check=True, timeout=30)
        return subprocess.Popen(
            ["nginx", "-c", str(folder / "nginx.conf"), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def __exit__(self, *_) -> None:
        for proc in (self.proc, self.proxy):
            if proc is None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
