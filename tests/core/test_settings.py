"""portal/settings/ and its strict environment readers."""

import os
import subprocess
import sys
import time

import pytest
from django.core.exceptions import ImproperlyConfigured

from portal.envvars import email_config, env_bool, env_int, env_list
from tests.conftest import ROOT


def load_settings(
    tmp_path, show: str = "s.SECRET_KEY, s.DEBUG, s.DATABASES['default']['ENGINE']", **env
) -> subprocess.CompletedProcess:
    """Import portal.settings in a fresh interpreter, as `manage.py` would at start, and print
    `show` (of the settings module `s`)."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k
        not in {
            "DATABASE_URL",
            "REDIS_URL",
            "SECRET_KEY",
            "FIELD_ENCRYPTION_KEY",
            "FIELD_ENCRYPTION_KEY_FILE",
        }
    }
    return subprocess.run(
        [
            sys.executable,
            "-c",
            f"import portal.settings as s; print({show})",
        ],
        cwd=ROOT,
        env=clean | {"VAR_DIR": str(tmp_path)} | env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("raw", "expected"), [("true", True), ("ON", True), ("1", True), ("no", False), ("0", False)]
)
def test_env_bool_reads_the_usual_spellings(monkeypatch, raw, expected):
    monkeypatch.setenv("SOME_FLAG", raw)
    assert env_bool("SOME_FLAG", not expected) is expected


def test_env_bool_refuses_a_typo(monkeypatch):
    monkeypatch.setenv("SOME_FLAG", "flase")
    with pytest.raises(ImproperlyConfigured, match="SOME_FLAG='flase' is not a boolean"):
        env_bool("SOME_FLAG", False)


def test_env_int_refuses_units_and_out_of_range(monkeypatch):
    monkeypatch.setenv("SOME_TIMEOUT", "30s")
    with pytest.raises(ImproperlyConfigured, match="SOME_TIMEOUT='30s' is not a whole number"):
        env_int("SOME_TIMEOUT", 5)
    monkeypatch.setenv("SOME_TIMEOUT", "0")
    with pytest.raises(ImproperlyConfigured, match="below the minimum of 1"):
        env_int("SOME_TIMEOUT", 5, minimum=1)


def test_env_defaults_apply_to_unset_and_blank(monkeypatch):
    monkeypatch.setenv("SOME_LIST", "  ")
    assert env_list("SOME_LIST", ["a"]) == ["a"]
    monkeypatch.setenv("SOME_LIST", "a.example, b.example,")
    assert env_list("SOME_LIST", []) == ["a.example", "b.example"]


def test_malformed_debug_stops_the_start_naming_the_variable(tmp_path):
    result = load_settings(tmp_path, DEBUG="maybe")
    assert result.returncode != 0
    assert "DEBUG='maybe' is not a boolean" in result.stderr


def test_time_limits_out_of_order_stop_the_start(tmp_path):
    result = load_settings(tmp_path, CELERY_TASK_SOFT_TIME_LIMIT_S="400", CELERY_TASK_TIME_LIMIT_S="300")
    assert result.returncode != 0
    assert (
        "CELERY_TASK_SOFT_TIME_LIMIT_S < CELERY_TASK_TIME_LIMIT_S < BROKER_VISIBILITY_TIMEOUT_S"
        in result.stderr
    )


def test_defaults_are_safe_and_secret_key_is_made_once(tmp_path):
    first = load_settings(tmp_path)
    assert first.returncode == 0, first.stderr
    key, debug, engine = first.stdout.split()
    assert debug == "False"
    assert engine == "django.db.backends.sqlite3"
    assert (tmp_path / "portal.sqlite3").parent == tmp_path
    secret_file = tmp_path / "secret_key"
    assert secret_file.stat().st_mode & 0o777 == 0o600
    assert len(key) >= 50
    second = load_settings(tmp_path)
    assert second.stdout.split()[0] == key


def test_secret_key_from_a_file(tmp_path):
    secret = tmp_path / "key"
    secret.write_text("k" * 40 + "\n")
    result = load_settings(tmp_path, SECRET_KEY_FILE=str(secret))
    assert result.stdout.split()[0] == "k" * 40
    assert not (tmp_path / "secret_key").exists()


def test_database_url_selects_postgresql(tmp_path):
    result = load_settings(tmp_path, DATABASE_URL="postgres://portal@db.internal:5432/portal")
    assert result.stdout.split()[2] == "django.db.backends.postgresql"


def test_prepared_statements_keep_the_database_urls_options(tmp_path):
    url = "postgres://portal@db.internal:5432/portal?sslmode=verify-full&connect_timeout=5"
    shown = "sorted(s.DATABASES['default']['OPTIONS'].items())"
    result = load_settings(tmp_path, show=shown, DATABASE_URL=url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(
        [
            ("connect_timeout", 5),
            ("prepare_threshold", 2),
            ("server_side_binding", True),
            ("sslmode", "verify-full"),
        ]
    )
    result = load_settings(tmp_path, show=shown, DATABASE_URL=url, DB_PREPARE_THRESHOLD="0")
    assert result.stdout.strip() == str([("connect_timeout", 5), ("sslmode", "verify-full")])


def test_email_url_forms():
    smtp = email_config("smtp+tls://mailer:p%40ss@mail.example.org:2525?from=gpu@example.org")
    assert smtp["EMAIL_HOST"] == "mail.example.org"
    assert smtp["EMAIL_PORT"] == 2525
    assert smtp["EMAIL_HOST_PASSWORD"] == "p@ss"
    assert smtp["EMAIL_USE_TLS"] is True
    assert smtp["DEFAULT_FROM_EMAIL"] == "gpu@example.org"
    assert email_config("smtps://mail.example.org")["EMAIL_PORT"] == 465
    assert email_config("file:///var/mail")["EMAIL_FILE_PATH"] == "/var/mail"
    with pytest.raises(ImproperlyConfigured, match="scheme 'pop3'"):
        email_config("pop3://mail.example.org")
    with pytest.raises(ImproperlyConfigured, match="names no SMTP host"):
        email_config("smtp://")


def test_the_sender_of_error_mail_follows_the_email_urls_from(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", "import portal.settings as s; print(s.DEFAULT_FROM_EMAIL, s.SERVER_EMAIL)"],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
        | {"VAR_DIR": str(tmp_path), "EMAIL_URL": "smtp://mail.example.org?from=gpu@example.org"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["gpu@example.org", "gpu@example.org"]


def test_the_field_encryption_key_is_made_once_and_kept_private(tmp_path):
    first = load_settings(tmp_path, show="s.FIELD_ENCRYPTION_KEY")
    assert first.returncode == 0, first.stderr
    key_file = tmp_path / "field_encryption_key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert first.stdout.strip() == repr([key_file.read_text().strip()])
    assert load_settings(tmp_path, show="s.FIELD_ENCRYPTION_KEY").stdout == first.stdout
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".field_encryption_key")] == []


def test_processes_starting_together_agree_on_one_field_key(tmp_path):
    script = "import portal.settings as s; print(s.FIELD_ENCRYPTION_KEY[0])"
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}} | {
        "VAR_DIR": str(tmp_path)
    }
    procs = [
        subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    keys = {proc.communicate(timeout=60)[0].strip() for proc in procs}
    assert keys == {(tmp_path / "field_encryption_key").read_text().strip()}


def test_field_encryption_keys_from_the_environment_or_a_file(tmp_path):
    from cryptography.fernet import Fernet

    new, old = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    listed = load_settings(tmp_path, show="s.FIELD_ENCRYPTION_KEY", FIELD_ENCRYPTION_KEY=f"{new}, {old}")
    assert listed.stdout.strip() == repr([new, old])
    assert not (tmp_path / "field_encryption_key").exists()
    key_file = tmp_path / "keys"
    key_file.write_text(f"{new}\n")
    from_file = load_settings(
        tmp_path, show="s.FIELD_ENCRYPTION_KEY", FIELD_ENCRYPTION_KEY_FILE=str(key_file)
    )
    assert from_file.stdout.strip() == repr([new])


def test_a_malformed_field_encryption_key_stops_the_start_without_echoing_it(tmp_path):
    result = load_settings(tmp_path, FIELD_ENCRYPTION_KEY="not-a-fernet-key-hunter2")
    assert result.returncode != 0
    assert "FIELD_ENCRYPTION_KEY: key 1 is not a Fernet key" in result.stderr
    assert "hunter2" not in result.stderr


def test_processes_that_start_together_agree_on_one_secret_key(tmp_path):
    """Web workers, the Celery worker and beat start at once against an empty VAR_DIR: they must
    all sign with the same key, and none with a half-written or empty one. Three empty VAR_DIRs,
    twelve processes each, since one race alone is often won cleanly even without the fix."""
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "SECRET_KEY"}}
    start_at = time.time() + 4  # after every interpreter is up, so that they reach the file together
    code = (
        # What settings imports comes first, so that the processes reach the key file together.
        "import os, time, secrets, dj_database_url, django.core.exceptions, portal.envvars; "
        "time.sleep(max(0.0, float(os.environ['START_AT']) - time.time())); "
        "import portal.settings as s; print(repr(s.SECRET_KEY))"
    )
    var_dirs = [tmp_path / f"var{n}" for n in range(3)]
    procs = [
        (var_dir, subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=clean | {"VAR_DIR": str(var_dir), "START_AT": str(start_at)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ))
        for var_dir in var_dirs
        for _ in range(12)
    ]  # fmt: skip
    keys: dict = {var_dir: set() for var_dir in var_dirs}
    for var_dir, proc in procs:
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        keys[var_dir].add(out.strip())
    for var_dir, found in keys.items():
        assert len(found) == 1, found
        (key,) = found
        assert len(key) >= 50
        assert key.strip("'") == (var_dir / "secret_key").read_text()
        assert [p.name for p in var_dir.iterdir() if p.name.startswith(".secret_key")] == []
