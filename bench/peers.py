"""The peers that bench/load.py measures the portal's API against, in the same run and on the
same machine, so that their ratios hold however noisy the machine is:

- slurmrestd, Slurm's own REST daemon, as the testbed runs it (tests/testbed/testbed.sh: JWT on
  loopback, openapi/v0.0.38 of Slurm 22.05), with a token of the portal's Slurm user;
- sbatch called directly over the portal's own SSH path (clusters/backends/slurm/ssh.py: the
  pooled paramiko connection, one channel per command), the floor under any submission of the
  portal, whose Celery worker goes the same way.

Jobs that the peers submit never start: their begin time is 30 days ahead, so that thousands of
them neither fill the shared two-node testbed nor run anything. Whoever submits cancels them at
the end (`SbatchOverSsh.cancel`, one scancel per few hundred ids, works for both peers' jobs).
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from clusters.backends.base import ClusterConfig
from clusters.backends.slurm import ssh
from tests.testbed.env import testbed_config

BEGIN = "now+30days"  # sbatch --begin syntax; slurmrestd 22.05 parses begin_time the same way
SCRIPT = "#!/bin/bash\ntrue\n"
WALLTIME_MINUTES = 5
SCANCEL_BATCH = 500  # ids per scancel: well under any argv limit
CONNECT_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_S = 60.0


class PeerError(RuntimeError):
    """A peer answered, but not with what was asked for (an HTTP error, a Slurm error, no id).
    job_id: the job a submission created all the same (slurmrestd names one beside its errors),
    for the caller to cancel."""

    def __init__(self, message: str, job_id: str | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=value lines of the testbed's env file (var/testbed/testbed.env)."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs if not key.lstrip().startswith("#")}


def ssh_config_from_env(env: dict[str, str]) -> ClusterConfig:
    """The ClusterConfig of the testbed as its env file describes it, the same fields as
    manage.py register_testbed stores, so that the SSH peer takes the portal's own path."""
    return testbed_config(env, slug="testbed-bench")


def _run(config: ClusterConfig, argv: list[str], stdin: str | None = None) -> str:
    result = ssh.run(
        config, argv, stdin=stdin, connect_timeout_s=CONNECT_TIMEOUT_S, timeout_s=COMMAND_TIMEOUT_S, record=[]
    )
    if result.rc != 0:
        raise PeerError(result.message)
    return result.stdout


def slurm_token(user: str, lifespan_s: int) -> str:
    """A JWT for a job identity, asked for as that user (`scontrol token`), as a researcher on the
    login node would: the testbed is this machine, and the identity has no SSH login. The portal's
    service user may submit no job, so its own token would be no peer. A secret: never printed."""
    argv = ["runuser", "-u", user, "--", "scontrol", "token", f"lifespan={int(lifespan_s)}"]
    try:
        out = subprocess.run(
            argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise PeerError(f"scontrol token as {user} failed: {type(exc).__name__}") from None
    out = out.strip()
    if not out.startswith("SLURM_JWT="):
        raise PeerError("scontrol token answered no SLURM_JWT=… line")
    return out.removeprefix("SLURM_JWT=")


def slurm_config(config: ClusterConfig) -> dict[str, str]:
    """slurmctld's running configuration (`scontrol show config`), e.g. MaxJobCount."""
    pairs = (line.split("=", 1) for line in _run(config, ["scontrol", "show", "config"]).splitlines())
    return {key.strip(): value.strip() for key, *value in pairs for value in value}


class LoopbackHttp:
    """A keep-alive HTTP/1.1 client of one loopback server: one connection per thread (the load
    generator's threads each keep theirs), reopened once when the server closed it between two
    requests. Loopback only: the benchmarks talk to nothing else."""

    def __init__(self, base_url: str, timeout_s: float = 60.0) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme != "http" or url.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"{base_url}: only http on loopback")
        self.host, self.port, self.timeout_s = url.hostname, url.port or 80, timeout_s
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        return conn

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        self._local.conn = None

    def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None = None
    ) -> tuple[int, bytes]:
        """(status, body). A connection the server closed while idle is retried once on a new
        one; nothing was processed on it, so the retry cannot do anything twice."""
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                raw = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self._drop(conn)
                if attempt == 2:
                    raise
                continue
            except BaseException:
                self._drop(conn)  # a timeout or a half-read answer: the connection is unusable
                raise
            if response.will_close:
                self._drop(conn)
            return response.status, raw
        raise AssertionError("unreachable")


@dataclass
class SlurmRestd:
    """A client of slurmrestd's openapi/<api> plugin (JWT in X-SLURM-USER-* headers)."""

    base_url: str
    api: str
    user: str
    token: str = field(repr=False)
    account: str
    partition: str
    gres: str  # e.g. "gpu:h100:1", as sbatch --gres takes it
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        self._http = LoopbackHttp(self.base_url, self.timeout_s)
        self._headers = {
            "X-SLURM-USER-NAME": self.user,
            "X-SLURM-USER-TOKEN": self.token,
            "Accept": "application/json",
        }

    def request(self, method: str, path: str, body: dict | None = None) -> dict:
        """The decoded answer; PeerError on an HTTP status ≥ 400 or a body that is not JSON."""
        headers = dict(self._headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        status, raw = self._http.request(method, path, headers, data)
        if status >= 400:
            raise PeerError(f"slurmrestd {method} {path}: HTTP {status}: {raw[:200]!r}")
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise PeerError(f"slurmrestd {method} {path}: not JSON ({exc})") from None

    def _path(self, tail: str) -> str:
        return f"/slurm/{self.api}/{tail}"

    @staticmethod
    def _errors(answer: dict, ignore: tuple[int, ...] = ()) -> list[dict]:
        return [e for e in answer.get("errors") or [] if e.get("error_code") not in ignore]

    def ping(self) -> dict:
        answer = self.request("GET", self._path("ping"))
        if self._errors(answer) or not answer.get("pings"):
            raise PeerError(f"ping: {self._errors(answer) or 'no pings'}")
        return answer

    def get_job(self, job_id: str) -> dict:
        answer = self.request("GET", self._path(f"job/{int(job_id)}"))
        jobs = answer.get("jobs") or []
        if self._errors(answer) or len(jobs) != 1:
            raise PeerError(f"get job {job_id}: {self._errors(answer) or f'{len(jobs)} jobs'}")
        return jobs[0]

    def submit(self, name: str) -> str:
        """Submit a job like the SSH peer's (same account, partition, GRES, walltime, begin)."""
        job = {
            "name": name,
            "account": self.account,
            "partition": self.partition,
            "gres": self.gres,
            "time_limit": WALLTIME_MINUTES,
            "begin_time": BEGIN,
            "current_working_directory": "/",  # exists on every node; the job writes nothing
            "standard_output": "/dev/null",
            "environment": {"PATH": "/usr/bin:/bin"},
        }
        answer = self.request("POST", self._path("job/submit"), {"script": SCRIPT, "job": job})
        job_id = answer.get("job_id")
        if self._errors(answer) or not isinstance(job_id, int):
            created = str(job_id) if isinstance(job_id, int) else None
            raise PeerError(f"submit: {self._errors(answer) or 'no job_id'}", job_id=created)
        return str(job_id)

    def list_jobs(self) -> list[dict]:
        """Every job slurmctld knows, of every user, in one answer: the API has no filter but
        update_time, and no pages."""
        answer = self.request("GET", self._path("jobs"))
        if self._errors(answer):
            raise PeerError(f"list jobs: {self._errors(answer)}")
        return answer.get("jobs") or []

    def cancel(self, job_id: str) -> None:
        answer = self.request("DELETE", self._path(f"job/{int(job_id)}"))
        if self._errors(answer):
            raise PeerError(f"cancel {job_id}: {self._errors(answer)}")

    @classmethod
    def for_testbed(cls, env: dict[str, str], config: ClusterConfig, *, lifespan_s: int) -> SlurmRestd:
        """The testbed's slurmrestd with a fresh token of its portal user, on its first partition."""
        partition, gres_type, _ = env["SLURM_TESTBED_PARTITIONS"].split(",")[0].split(":")
        return cls(
            base_url=env["SLURMRESTD_URL"],
            api=env["SLURMRESTD_API"],
            user=env["SLURMRESTD_USER"],
            token=slurm_token(env["SLURMRESTD_USER"], lifespan_s),
            account=env["SLURM_TESTBED_ACCOUNT"],
            partition=partition,
            gres=f"gpu:{gres_type}:1",
        )


@dataclass
class SbatchOverSsh:
    """sbatch on the cluster's login node through the portal's pooled SSH connection and its
    sudoers rule, as the job identity, as the portal's Celery worker submits
    (clusters/backends/slurm/submit.py), less its mkdir."""

    config: ClusterConfig
    account: str
    partition: str
    gres: str
    user: str  # the job identity of the account

    def submit(self, name: str) -> str:
        out = _run(
            self.config,
            [
                *("sudo", "-n", "-u", self.user, "--"),
                "sbatch",
                "--parsable",
                f"--job-name={name}",
                f"--account={self.account}",
                f"--partition={self.partition}",
                f"--gres={self.gres}",
                f"--time={WALLTIME_MINUTES}",
                f"--begin={BEGIN}",
                "--output=/dev/null",
                "--chdir=/",
            ],
            stdin=SCRIPT,
        )
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise PeerError(f"sbatch answered {out.strip()[:200]!r}, not a job id")
        return job_id

    def cancel(self, job_ids: list[str]) -> None:
        """scancel the given jobs (either peer's), a few hundred per command."""
        ids = [str(int(job_id)) for job_id in job_ids]
        for start in range(0, len(ids), SCANCEL_BATCH):
            _run(self.config, ["scancel", *ids[start : start + SCANCEL_BATCH]])

    def cancel_named(self, name: str) -> None:
        """scancel every job of the SSH user with this name: the jobs whose submission timed out
        on the client yet reached slurmctld, which no id names. Use a name unique to the run."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):  # scancel reads a comma as a second name
            raise ValueError(f"unsuitable job name for scancel --name: {name!r}")
        _run(self.config, ["scancel", f"--name={name}"])

    @classmethod
    def for_testbed(cls, env: dict[str, str], config: ClusterConfig) -> SbatchOverSsh:
        partition, gres_type, _ = env["SLURM_TESTBED_PARTITIONS"].split(",")[0].split(":")
        return cls(
            config=config,
            account=env["SLURM_TESTBED_ACCOUNT"],
            partition=partition,
            gres=f"gpu:{gres_type}:1",
            user=env["SLURM_TESTBED_IDENTITY"],
        )
