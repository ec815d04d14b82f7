"""Logs are JSON lines on stderr and, with LOG_FILE, in that file; secrets never reach them."""

import json
import logging
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.factories import PASSWORD

SNIPPET = "; ".join(
    [
        "import django",
        "django.setup()",
        "import logging",
        "logging.getLogger('portal.test').warning('disk %s', 'full')",
    ]
)


def test_json_lines_to_stderr_and_log_file(tmp_path):
    log_file = tmp_path / "portal.log"
    env = os.environ | {
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "VAR_DIR": str(tmp_path),
        "LOG_FILE": str(log_file),
    }
    env.pop("DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, "-c", SNIPPET], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    for line in (result.stderr.strip().splitlines()[-1], log_file.read_text().strip().splitlines()[-1]):
        record = json.loads(line)
        assert record["level"] == "WARNING"
        assert record["logger"] == "portal.test"
        assert record["message"] == "disk full"
        assert "time" in record


@pytest.mark.django_db
def test_neither_password_nor_token_is_logged(anon_client, member, caplog):
    caplog.set_level(logging.DEBUG)
    response = anon_client.post("/api/v1/auth/token/", {"username": "member", "password": PASSWORD})
    key = response.json()["token"]
    anon_client.get("/api/v1/me/", HTTP_AUTHORIZATION=f"Token {key}")
    anon_client.post("/api/v1/auth/token/", {"username": "member", "password": "wrong-but-secret"})
    logged = "\n".join(
        record.getMessage() + str(record.__dict__.get("request", "")) for record in caplog.records
    )
    assert caplog.records, "nothing was logged at all: the check below would prove nothing"
    for secret in (key, PASSWORD, "wrong-but-secret"):
        assert secret not in logged
