"""Where the CLI keeps the portal's URL and the token: `config.json` in the user's config folder
(platformdirs: `$XDG_CONFIG_HOME/gpuportal`, else `~/.config/gpuportal` on Linux).

The file is made with mode 0600 from its first byte (a new file opened with that mode in a
folder of mode 0700, then renamed over the old one), so the token is never readable by others,
not even for a moment. GPUPORTAL_URL and GPUPORTAL_TOKEN override what the file holds.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from platformdirs import user_config_dir

from gpuportal.i18n import _

ENV_URL = "GPUPORTAL_URL"
ENV_TOKEN = "GPUPORTAL_TOKEN"  # noqa: S105  (the variable's name, not a token)
ENV_TIMEOUT = "GPUPORTAL_TIMEOUT"
ENV_CA_BUNDLE = "GPUPORTAL_CA_BUNDLE"
FILE_MODE = 0o600
DIR_MODE = 0o700


def config_dir() -> Path:
    return Path(user_config_dir("gpuportal", appauthor=False))


def config_path() -> Path:
    return config_dir() / "config.json"


def load() -> dict[str, Any]:
    """The stored settings ({} when there are none or the file is not ours to read)."""
    path = config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def too_open(path: Path | None = None) -> bool:
    """Whether the stored file may be read or written by others than its owner."""
    path = path or config_path()
    try:
        return bool(path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO))
    except FileNotFoundError:
        return False


def save(data: dict[str, Any]) -> Path:
    """Write the settings, mode 0600 from creation on, replacing the file in one rename."""
    folder = config_dir()
    folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    path = folder / "config.json"
    temporary = folder / f".config.json.{os.getpid()}.tmp"
    temporary.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(temporary, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # the mode exactly, whatever the umask kept
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            fd = -1
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        temporary.unlink(missing_ok=True)
        raise
    return path


def remove() -> bool:
    try:
        config_path().unlink()
    except FileNotFoundError:
        return False
    return True


@dataclass
class Settings:
    """What a command connects with, and where each part came from (`env`, `config` or none)."""

    url: str | None
    token: str | None
    url_from: str
    token_from: str
    timeout_s: float
    ca_bundle: str | None
    stored: dict[str, Any]


def resolve(environ: dict[str, str] | None = None) -> Settings:
    environ = dict(os.environ) if environ is None else environ
    stored = load()
    url, url_from = environ.get(ENV_URL, "").strip(), "env"
    if not url:
        url, url_from = (stored.get("url") or ""), "config"
    token, token_from = environ.get(ENV_TOKEN, "").strip(), "env"
    if not token:
        token, token_from = (stored.get("token") or ""), "config"
    try:
        timeout_s = float(environ.get(ENV_TIMEOUT, "") or 30)
    except ValueError:
        raise ValueError(_("{name} must be a number of seconds.").format(name=ENV_TIMEOUT)) from None
    if not 0 < timeout_s <= 600:
        raise ValueError(_("{name} must be a number of seconds.").format(name=ENV_TIMEOUT))
    return Settings(
        url=url or None,
        token=token or None,
        url_from=url_from if url else "",
        token_from=token_from if token else "",
        timeout_s=timeout_s,
        ca_bundle=environ.get(ENV_CA_BUNDLE) or None,
        stored=stored,
    )
