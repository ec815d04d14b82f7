"""The CLI tests' parts (tests/cli/): the installed `gpuportal` command run as a process in a home
of its own, in a pseudo-terminal when it must prompt, a job file, the API read straight to
compare with, and a poller that moves jobs on as beat would."""

import json
import os
import pty
import select
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from tests.conftest import VENV_BIN

GPUPORTAL = VENV_BIN / "gpuportal"
# What a terminal passes on besides the locale; the CLI's own variables never come from outside.
PASSED = ("PATH", "TMPDIR", "TERM")
RUN_TIMEOUT_S = 60

SCRIPT_JOB = {
    "tenant": "protein-lab",
    "scenario": "ai-training",
    "gpu_model": "h100-80gb",
    "gpus": 1,
    "walltime_minutes": 5,
    "name": "hello",
    "script": "#!/bin/bash\necho hello from the cli\n",
}


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str

    def json(self):
        assert self.rc == 0, self
        return json.loads(self.stdout)


@dataclass
class Cli:
    """`gpuportal` with HOME and XDG_CONFIG_HOME under `home`, English unless told, the portal at
    `url` and `token` through GPUPORTAL_URL/GPUPORTAL_TOKEN when given (None: nothing set)."""

    home: Path
    url: str | None = None
    token: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def env(self, **more: str) -> dict[str, str]:
        environ = {name: os.environ[name] for name in PASSED if name in os.environ}
        environ |= {"HOME": str(self.home), "XDG_CONFIG_HOME": str(self.home / ".config"), "LANG": "C.UTF-8",
                    "COLUMNS": "200", "GPUPORTAL_TIMEOUT": "20"}  # fmt: skip
        if self.url:
            environ["GPUPORTAL_URL"] = self.url
        if self.token:
            environ["GPUPORTAL_TOKEN"] = self.token
        return environ | self.extra | more

    def run(self, *args: str, input: str | None = None, timeout: float = RUN_TIMEOUT_S, **env: str) -> Result:
        done = subprocess.run(
            [str(GPUPORTAL), *args], input=input, capture_output=True, text=True, timeout=timeout, env=self.env(**env),
            cwd=self.home,
        )  # fmt: skip
        return Result(done.returncode, done.stdout, done.stderr)

    def json(self, *args: str, **env: str):
        return self.run(*args, "--json", **env).json()

    def start(self, *args: str, **env: str) -> subprocess.Popen:
        """The command running, its stdout a pipe (see Reader)."""
        return subprocess.Popen(
            [str(GPUPORTAL), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
            env=self.env(**env), cwd=self.home,
        )  # fmt: skip

    def config_file(self) -> Path:
        return self.home / ".config" / "gpuportal" / "config.json"

    def json_file(self) -> dict:
        return json.loads(self.config_file().read_text())


class Reader:
    """The process's stdout read by a thread of its own as it comes: `lines` holds (monotonic
    time it came, line) pairs; `finish` waits for the process's end and returns them."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: list[tuple[float, str]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def finish(self, timeout_s: float) -> list[tuple[float, str]]:
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(
                f"{self.proc.args} still running after {timeout_s}s: {self.lines[-5:]}"
            ) from None
        self.thread.join(timeout=5)
        return self.lines


def in_terminal(
    cli: Cli, args: list[str], answers: list[tuple[str, str]], *, umask: int = 0o022, timeout_s: float = 30
) -> tuple[int, str]:
    """Run the command on a pseudo-terminal that is its controlling terminal (as a shell would),
    under `umask`, answering each prompt that contains answers[i][0] with answers[i][1]; the
    exit code and everything the terminal showed."""
    argv, environ = [str(GPUPORTAL), *args], cli.env()
    pid, fd = pty.fork()
    if pid == 0:  # the child: the terminal is its stdin, stdout, stderr and /dev/tty
        try:
            os.chdir(cli.home)
            os.umask(umask)
            os.execve(argv[0], argv, environ)  # noqa: S606
        finally:
            os._exit(127)
    shown, pending, deadline = b"", list(answers), time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                shown += chunk
            if pending and pending[0][0].encode() in shown.rsplit(b"\n", 1)[-1]:
                os.write(fd, pending.pop(0)[1].encode() + b"\n")
        else:
            os.kill(pid, 9)
            raise AssertionError(
                f"gpuportal {args} did not end in {timeout_s}s: {shown.decode(errors='replace')}"
            )
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), shown.decode(errors="replace").replace("\r\n", "\n")


def rows_of(table: str) -> list[list[str]]:
    """A printed table's lines as words (its rule lines and blank lines left out)."""
    return [
        line.split() for line in table.splitlines() if line.strip() and not set(line.strip()) <= {"─", "━"}
    ]


def job_file(folder: Path, filename: str = "job.yaml", **fields) -> Path:
    """A job.yaml: SCRIPT_JOB's fields, `fields` replacing them (None drops one)."""
    spec = {k: v for k, v in (SCRIPT_JOB | fields).items() if v is not None}
    path = folder / filename
    path.write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
    return path


def api_get(base: str, token: str, path: str, **params):
    """What the API itself answers (the JSON), to compare the CLI's output with."""
    response = httpx.get(f"{base}/api/v1{path}", params=params, headers={"Authorization": f"Token {token}"},
                         timeout=20)  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()


def api_all(base: str, token: str, path: str, **params) -> list:
    """Every item of an API list, its `next` links followed."""
    items, url = [], f"{base}/api/v1{path}"
    with httpx.Client(headers={"Authorization": f"Token {token}"}, timeout=20) as client:
        while url:
            response = client.get(url, params=params)
            assert response.status_code == 200, response.text
            page, params = response.json(), None
            items += page["results"]
            url = page["next"]
    return items
