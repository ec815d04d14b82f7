"""SSH to a cluster's login node: one pooled paramiko connection per cluster and process.

Host keys come from the cluster's known_hosts text only and unknown or changed keys are
refused (RejectPolicy). Every remote command is an argv joined with shlex.join, runs on its own
channel of the pooled transport, and has a deadline for the whole exchange, so that a hung sshd
or a hung Slurm client cannot hold a worker past its time limit.
"""

from __future__ import annotations

import hashlib
import io
import os
import select
import shlex
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

import paramiko
from paramiko.hostkeys import HostKeyEntry

from clusters.backends.base import BackendError, BackendUnavailable, ClusterConfig

# Answers of Slurm's clients that mean "not now" rather than "no": the request may succeed later.
TRANSIENT_MARKERS = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "connection timed out",
    "communication connection failure",
    "zero bytes were transmitted or received",
    "problem talking to the database",
    "slurmdbd",
    "backup controller in standby",
    "temporarily unavailable",
    "temporarily unable",
    "munge",
    "authentication error",
)


@dataclass(frozen=True)
class CommandResult:
    argv: list[str]
    rc: int | None  # None: cut off (run(partial=True)), its exit unknown
    stdout: str
    stderr: str

    @property
    def message(self) -> str:
        """Slurm's own words for what went wrong, on one line."""
        text = " ".join((self.stderr.strip() or self.stdout.strip()).split())
        return text[:500] or f"{self.argv[0]} exited with {self.rc}"


def failure(result: CommandResult) -> BackendError:
    """The exception for a command that failed: transient answers are BackendUnavailable."""
    message = result.message
    if not message.startswith(f"{result.argv[0]}:"):
        message = f"{result.argv[0]}: {message}"
    if result.rc is None or result.rc < 0 or any(marker in message.lower() for marker in TRANSIENT_MARKERS):
        return BackendUnavailable(message)
    return BackendError(message)


@dataclass
class _Pooled:
    fingerprint: str
    pid: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    client: paramiko.SSHClient | None = None
    home: str = ""  # the login user's home directory, learnt once per connection

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.client, self.home = None, ""


# cluster slug → its connection. Keyed by pid too: a Celery prefork child must not share the
# parent's socket, so an entry inherited across fork() is dropped (not closed) and replaced.
POOL: dict[str, _Pooled] = {}
_POOL_LOCK = threading.Lock()
_COMMANDS: Counter[str] = Counter()  # cluster slug → commands sent by this process


def _fingerprint(config: ClusterConfig) -> str:
    parts = (
        config.ssh_host,
        str(config.ssh_port),
        config.ssh_user,
        config.ssh_known_hosts,
        config.ssh_private_key,
        config.ssh_key_passphrase,
    )
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _entry(config: ClusterConfig) -> _Pooled:
    fingerprint, pid = _fingerprint(config), os.getpid()
    with _POOL_LOCK:
        entry = POOL.get(config.slug)
        if entry is None or entry.fingerprint != fingerprint or entry.pid != pid:
            if entry is not None and entry.pid == pid:
                entry.close()  # the cluster's settings changed: drop the old connection
            entry = POOL[config.slug] = _Pooled(fingerprint=fingerprint, pid=pid)
        return entry


def private_key(text: str, passphrase: str = "") -> paramiko.PKey:
    """The cluster's private key (ed25519, ECDSA or RSA, in OpenSSH or PEM form), decrypted with
    its passphrase when it has one. The messages name no part of the key or passphrase."""
    needs_passphrase = False
    for key_class in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return key_class.from_private_key(io.StringIO(text), password=passphrase or None)
        except paramiko.PasswordRequiredException:
            needs_passphrase = True
        except (paramiko.SSHException, ValueError, TypeError):
            # A wrong passphrase reads as an unreadable key (paramiko cannot tell them apart for
            # every format); a key of another type fails the same way.
            continue
    if needs_passphrase:
        raise BackendUnavailable("the cluster's SSH private key is encrypted: set its passphrase")
    if passphrase:
        raise BackendUnavailable(
            "the cluster's SSH private key cannot be read with its passphrase: check both "
            "(an ed25519, ECDSA or RSA key is expected)"
        )
    raise BackendUnavailable("the cluster's SSH private key is not an ed25519, ECDSA or RSA key")


def _host_keys(client: paramiko.SSHClient, known_hosts: str) -> None:
    host_keys = client.get_host_keys()
    for number, line in enumerate(known_hosts.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith(("#", "@")):
            continue
        try:
            entry = HostKeyEntry.from_line(line, lineno=number)
        except (paramiko.SSHException, ValueError) as exc:
            raise BackendUnavailable(f"known_hosts line {number} is unreadable: {exc}") from None
        if entry is not None and entry.key is not None:
            for hostname in entry.hostnames:
                host_keys.add(hostname, entry.key.get_name(), entry.key)


def _connect(config: ClusterConfig, timeout_s: float) -> paramiko.SSHClient:
    """A connected, authenticated client, within timeout_s in all. paramiko bounds each step on
    its own (TCP connect, banner, key exchange, authentication), so a peer that answers each
    step just in time could hold a worker for four timeouts: a watchdog shuts the socket at the
    deadline, which ends whichever step is under way."""
    client = paramiko.SSHClient()
    _host_keys(client, config.ssh_known_hosts)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    where = f"{config.ssh_user}@{config.ssh_host}:{config.ssh_port}"
    pkey = private_key(config.ssh_private_key, config.ssh_key_passphrase)
    started = time.monotonic()
    try:
        sock = socket.create_connection((config.ssh_host, config.ssh_port), timeout=timeout_s)
    except OSError as exc:
        client.close()
        raise BackendUnavailable(f"SSH to {where} failed: {exc or type(exc).__name__}") from None
    fired = threading.Event()
    watchdog = threading.Timer(max(0.0, timeout_s - (time.monotonic() - started)), _shut, (sock, fired))
    watchdog.daemon = True
    watchdog.start()
    try:
        client.connect(
            config.ssh_host,
            port=config.ssh_port,
            username=config.ssh_user,
            pkey=pkey,
            sock=sock,
            timeout=timeout_s,
            banner_timeout=timeout_s,
            auth_timeout=timeout_s,
            channel_timeout=timeout_s,
            allow_agent=False,
            look_for_keys=False,
        )
    except paramiko.BadHostKeyException as exc:
        client.close()
        sock.close()
        # Not the job's fault and not to be retried silently either: jobs wait (unavailable) and
        # the cluster's health says why, until an admin checks and updates known_hosts.
        raise BackendUnavailable(
            f"SSH host key of {where} does not match known_hosts (offered {exc.key.get_name()} "
            f"{exc.key.fingerprint}): possible man-in-the-middle, refusing to connect"
        ) from None
    except (paramiko.SSHException, EOFError, OSError) as exc:
        client.close()
        sock.close()
        why = exc or type(exc).__name__
        if fired.is_set():  # the watchdog: the deadline, not the peer, ended the attempt
            why = f"no SSH session within {timeout_s:g}s"
        raise BackendUnavailable(f"SSH to {where} failed: {why}") from None
    except BaseException:
        client.close()
        sock.close()
        raise
    finally:
        watchdog.cancel()
    transport = client.get_transport()
    assert transport is not None
    transport.set_keepalive(30)  # notice a silently dropped connection between two uses
    # Nagle and the server's delayed ACK cost ~40 ms on every channel open without this
    with suppress(OSError, AttributeError):
        transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client


def _shut(sock: socket.socket, fired: threading.Event) -> None:
    fired.set()
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _transport(config: ClusterConfig, timeout_s: float) -> tuple[_Pooled, paramiko.Transport]:
    entry = _entry(config)
    with entry.lock:
        transport = entry.client.get_transport() if entry.client is not None else None
        if transport is None or not transport.is_active():
            entry.close()
            entry.client = _connect(config, timeout_s)
            transport = entry.client.get_transport()
        assert transport is not None
        return entry, transport


def _forget(entry: _Pooled, transport: paramiko.Transport) -> None:
    with entry.lock:
        if entry.client is not None and entry.client.get_transport() is transport:
            entry.close()


def open_channel(config: ClusterConfig, timeout_s: float) -> paramiko.Channel:
    """A new session channel on the pooled connection. A transport that died since its last
    use (sshd restarted, network cut) is replaced once; nothing has run on it yet, so the
    retry cannot run anything twice."""
    for attempt in (1, 2):
        entry, transport = _transport(config, timeout_s)
        try:
            return transport.open_session(timeout=timeout_s)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            _forget(entry, transport)
            if attempt == 2:
                raise BackendUnavailable(f"SSH to {config.ssh_host}: no channel: {exc}") from None
    raise AssertionError("unreachable")


def home_directory(config: ClusterConfig, connect_timeout_s: float, timeout_s: float) -> str:
    """The login user's home, asked once per connection over SFTP (no shell involved)."""
    entry = _entry(config)
    if entry.home and entry.client is not None:
        return entry.home
    with sftp_session(config, connect_timeout_s, timeout_s) as sftp:
        home = sftp.normalize(".")
    entry.home = home
    return home


@contextmanager
def sftp_session(
    config: ClusterConfig, connect_timeout_s: float, timeout_s: float
) -> Iterator[paramiko.SFTPClient]:
    """An SFTP client on its own channel of the pooled connection; each request waits at most
    timeout_s."""
    channel = open_channel(config, connect_timeout_s)
    try:
        channel.settimeout(timeout_s)
        channel.invoke_subsystem("sftp")
        sftp = paramiko.SFTPClient(channel)
    except (paramiko.SSHException, EOFError, OSError) as exc:
        channel.close()
        raise BackendUnavailable(f"SFTP on {config.ssh_host}: {exc or type(exc).__name__}") from None
    try:
        yield sftp
    except TimeoutError:
        raise BackendUnavailable(f"SFTP on {config.ssh_host} did not answer within {timeout_s:g}s") from None
    except (paramiko.SSHException, EOFError) as exc:
        raise BackendUnavailable(f"SFTP on {config.ssh_host}: {exc or type(exc).__name__}") from None
    finally:
        sftp.close()


def run(
    config: ClusterConfig,
    argv: list[str],
    *,
    stdin: str | None,
    connect_timeout_s: float,
    timeout_s: float,
    record: list[list[str]],
    partial: bool = False,
) -> CommandResult:
    """Run argv on the login node and wait for it, at most timeout_s in all. The argv is
    appended to `record` once the command was sent.

    A command that outlives timeout_s, or whose connection breaks once it was sent, raises
    BackendUnavailable; with `partial`, it returns what it printed so far instead, with rc
    None: the caller reads how far the command got (a batch of sbatch calls does)."""
    for arg in argv:
        if "\0" in arg or "\n" in arg or "\r" in arg:
            raise BackendError(f"refusing a line break or NUL byte in an argument of {argv[0]}")
    channel = open_channel(config, connect_timeout_s)
    deadline = time.monotonic() + timeout_s
    stdout, stderr = bytearray(), bytearray()
    sent = False
    try:
        channel.settimeout(timeout_s)
        sent = True  # from here on the command may run, whether or not sshd's answer arrives
        channel.exec_command(shlex.join(argv))
        record.append(list(argv))
        with _POOL_LOCK:
            _COMMANDS[config.slug] += 1
        if stdin is not None:
            channel.sendall(stdin.encode())
        channel.shutdown_write()
        while True:
            while channel.recv_ready():
                stdout += channel.recv(65536)
            while channel.recv_stderr_ready():
                stderr += channel.recv_stderr(65536)
            if channel.eof_received and channel.exit_status_ready():
                if not (channel.recv_ready() or channel.recv_stderr_ready()):
                    break
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if channel.eof_received:
                # Nothing but the exit status can come after EOF, and the channel's fd stays
                # readable from EOF on: waiting on it here would spin until sshd reaps the command.
                channel.status_event.wait(min(remaining, 0.5))
            else:
                # the channel's fd wakes us on stdout and stderr data, on EOF and on close
                select.select([channel], [], [], min(remaining, 0.5))
        rc = channel.recv_exit_status()
    except TimeoutError:
        if partial and sent:
            return _partial(argv, stdout, stderr, f"did not finish within {timeout_s:g}s")
        raise BackendUnavailable(
            f"{argv[0]} on {config.ssh_host} did not finish within {timeout_s:g}s"
        ) from None
    except (paramiko.SSHException, EOFError, OSError) as exc:
        if partial and sent:
            return _partial(argv, stdout, stderr, f"connection lost: {exc or type(exc).__name__}")
        raise BackendUnavailable(f"{argv[0]} on {config.ssh_host}: {exc or type(exc).__name__}") from None
    finally:
        channel.close()
    return CommandResult(argv, rc, stdout.decode(errors="replace"), stderr.decode(errors="replace"))


def _partial(argv: list[str], stdout: bytearray, stderr: bytearray, why: str) -> CommandResult:
    text = stderr.decode(errors="replace")
    return CommandResult(argv, None, stdout.decode(errors="replace"), f"{text}\n{argv[0]}: {why}".lstrip())


def commands_run(slug: str) -> int:
    """Remote commands this process sent to the cluster: a scheduler call is one command."""
    with _POOL_LOCK:
        return _COMMANDS[slug]
