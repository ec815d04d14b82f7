"""What the benches share about the processes they start (gunicorn, Celery workers and beat)."""

import subprocess


def stop_all(procs: list[subprocess.Popen], *, timeout_s: float = 30) -> None:
    """SIGTERM to all at once, then each gets timeout_s to exit before SIGKILL."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
