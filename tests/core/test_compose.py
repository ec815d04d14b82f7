"""docker-compose.yml: no Docker engine runs here, so check that the file and the project agree,
down to the configurations its Prometheus and Alertmanager run, checked by promtool and amtool."""

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from django.core.management import get_commands
from django.urls import resolve

import portal.settings  # noqa: F401  (importing records every variable the settings read)
from portal.envvars import READ
from tests.conftest import ROOT

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
PORTAL_SERVICES = ["web", "stream", "worker", "beat"]
MONITORING_SERVICES = ["prometheus", "alertmanager", "grafana"]
WEB_ENV = COMPOSE["services"]["web"]["environment"]  # the shared portal environment merged in


def argv(command) -> list[str]:
    words = shlex.split(command) if isinstance(command, str) else list(command)
    if words[:2] == ["sh", "-c"]:
        return [w for part in words[2].split("&&") for w in shlex.split(part.replace("exec ", "", 1))]
    return words


def test_the_stack_has_every_part():
    assert set(COMPOSE["services"]) == {"postgres", "redis", "proxy", *PORTAL_SERVICES, *MONITORING_SERVICES}


def test_the_proxy_runs_the_projects_nginx_config_in_front_of_the_only_web():
    proxy, web = COMPOSE["services"]["proxy"], COMPOSE["services"]["web"]
    assert proxy["volumes"] == ["./deploy/nginx/portal.conf:/etc/portal-nginx/portal.conf:ro"]
    command = " ".join(proxy["command"])
    template = (ROOT / "deploy" / "nginx" / "portal.conf").read_text()
    assert set(re.findall(r"@([A-Z]+)@", template)) == set(re.findall(r"s#@([A-Z]+)@#", command))
    assert "s#@UPSTREAM@#web:8000#g" in command and "ports" not in web
    assert proxy["ports"] == ["8000:8000"] and web["environment"]["NUM_PROXIES"] == "1"


@pytest.mark.parametrize("name", sorted(COMPOSE["services"]))
def test_every_service_has_a_healthcheck(name):
    assert COMPOSE["services"][name]["healthcheck"]["test"]


@pytest.mark.parametrize("name", PORTAL_SERVICES)
def test_portal_services_use_the_image_built_here(name):
    service = COMPOSE["services"][name]
    assert service["build"] == "."
    assert (ROOT / "Dockerfile").exists()


@pytest.mark.parametrize("name", PORTAL_SERVICES)
def test_commands_name_things_that_exist(name):
    service = COMPOSE["services"][name]
    check = service["healthcheck"]["test"]
    words = argv(service["command"]) + (shlex.split(check[1]) if check[0] == "CMD-SHELL" else check[1:])
    commands = get_commands()
    for index, word in enumerate(words):
        if word == "portal.wsgi":
            assert (ROOT / "portal" / "wsgi.py").exists()
        if word == "-A":
            assert (ROOT / words[index + 1] / "celery.py").exists()
        if word == "manage.py":
            assert words[index + 1] in commands, f"{name}: no management command {words[index + 1]!r}"


@pytest.mark.parametrize("name", PORTAL_SERVICES)
def test_every_variable_set_is_one_the_portal_reads(name):
    environment = COMPOSE["services"][name]["environment"]
    unknown = sorted(set(environment) - READ)
    assert not unknown, f"{name} sets variables the portal never reads: {unknown}"


# --- Prometheus, Alertmanager and Grafana (README, Monitoring)


@pytest.mark.parametrize("name", MONITORING_SERVICES)
def test_monitoring_images_are_pinned_and_published_on_loopback_only(name):
    service = COMPOSE["services"][name]
    repository, _, tag = service["image"].partition(":")
    assert repository in {"prom/prometheus", "prom/alertmanager", "grafana/grafana-oss"}
    assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: not a pinned version: {service['image']}"
    assert all(port.startswith("127.0.0.1:") for port in service.get("ports", []))


def test_alertmanager_publishes_nothing_and_shares_an_internal_network_with_prometheus_and_web_only():
    # Whoever reached Alertmanager's API could have it relay made-up alerts with the portal's token.
    alertmanager = COMPOSE["services"]["alertmanager"]
    assert "ports" not in alertmanager and alertmanager["networks"] == ["alerts"]
    assert COMPOSE["networks"]["alerts"] == {"internal": True}
    on_alerts = {
        name for name, service in COMPOSE["services"].items() if "alerts" in service.get("networks", [])
    }
    assert on_alerts == {"alertmanager", "prometheus", "web"}


@pytest.mark.parametrize("name", MONITORING_SERVICES)
def test_monitoring_services_mount_files_of_the_repository_and_declared_secrets(name):
    service = COMPOSE["services"][name]
    binds = [v.split(":")[0] for v in service["volumes"] if v.startswith("./")]
    assert binds and all((ROOT / path).exists() for path in binds), binds
    named = [v.split(":")[0] for v in service["volumes"] if not v.startswith("./")]
    assert set(named) <= set(COMPOSE["volumes"])
    assert set(service.get("secrets", [])) <= set(COMPOSE["secrets"])


def test_no_secret_is_written_into_the_compose_file():
    # Every token, password or key comes from the environment (.env) or a secret's file.
    for name, service in COMPOSE["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if re.search(r"TOKEN|PASSWORD|SECRET|_KEY", key):
                assert re.fullmatch(r"\$\{\w+:\?[^}]*\}|/run/secrets/\w+", str(value)), (name, key, value)
    for secret in COMPOSE["secrets"].values():
        assert set(secret) == {"environment"}


def test_grafana_wants_a_login_with_a_password_from_a_secret_file_and_will_not_start_without():
    grafana = COMPOSE["services"]["grafana"]
    environment = grafana["environment"]
    assert environment["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert environment["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert "GF_SECURITY_ADMIN_PASSWORD" not in environment  # `docker inspect` would show it
    assert environment["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/secrets/grafana_admin_password"
    assert COMPOSE["secrets"]["grafana_admin_password"] == {"environment": "GRAFANA_ADMIN_PASSWORD"}
    check = " ".join(grafana["entrypoint"])
    assert "test -s /run/secrets/grafana_admin_password" in check and check.endswith("exec /run.sh")


def _interpolated(text: str) -> str:
    """Compose's interpolation of `${NAME:-default}` with nothing set in the environment."""
    assert not re.search(r"\$\{\w+(?::?\?)", text), f"a required variable in a config value: {text}"
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)


def _filled(name: str, tmp_path) -> tuple[dict, list[str], Path]:
    """The configuration a monitoring container runs: the shipped template its entrypoint's sed
    fills, with each path in the container turned into the repository file (or a secret's
    stand-in file) that compose mounts there. Returns (what sed replaced, the program's argv,
    the local copy's path)."""
    service = COMPOSE["services"][name]
    assert service["entrypoint"][:2] == ["sh", "-c"]
    fill, run = service["entrypoint"][2].split(" && ")
    script, _, output = fill.partition(" > ")
    words = shlex.split(script)
    assert words[0] == "sed" and set(words[1:-1:2]) == {"-e"}, words
    scripts = [re.fullmatch(r"s#@([A-Z_]+)@#([^#]*)#g", script) for script in words[2:-1:2]]
    assert all(scripts), words
    replaced = {script[1]: script[2] for script in scripts}
    mounts = {}
    for volume in service["volumes"]:
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            mounts[target] = str(ROOT / source[2:])
    for secret in service["secrets"]:
        stand_in = tmp_path / secret
        stand_in.write_text("token-of-the-test\n")
        mounts[f"/run/secrets/{secret}"] = str(stand_in)

    def local(path: str) -> str:
        for target in sorted(mounts, key=len, reverse=True):
            if path == target or path.startswith(target + "/"):
                return mounts[target] + path[len(target) :]
        raise AssertionError(f"{name}: {path} is mounted from nowhere")

    text = Path(local(words[-1])).read_text()
    config = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert set(re.findall(r"@([A-Z_]+)@", config)) == set(replaced), "fills every placeholder, no other"
    for key, value in replaced.items():
        value = _interpolated(value)
        text = text.replace(f"@{key}@", local(value) if value.startswith("/") else value)
    argv = shlex.split(run.removeprefix("exec "))
    assert f"--config.file={output.strip()}" in argv
    path = tmp_path / f"{name}.yml"
    path.write_text(text)
    return replaced, argv, path


def _check(*argv: str) -> None:
    assert shutil.which(argv[0]), f"{argv[0]} is not installed (.ci/run installs it)"
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_prometheus_runs_the_shipped_config_filled_for_this_stack(tmp_path):
    replaced, argv, path = _filled("prometheus", tmp_path)
    _check("promtool", "check", "config", str(path))  # the rules it loads included
    config = yaml.safe_load(path.read_text())
    assert any(rule.endswith("deploy/prometheus/rules/portal.rules.yml") for rule in config["rule_files"])
    portal = next(job for job in config["scrape_configs"] if job["job_name"] == "portal")
    # web itself, on the port its gunicorn binds, and web answers to that host name
    assert portal["static_configs"] == [{"targets": ["web:8000"]}]
    assert "0.0.0.0:8000" in " ".join(COMPOSE["services"]["web"]["command"])
    assert WEB_ENV["ALLOWED_HOSTS"].split(",")[-1] == "web"
    # with the METRICS_TOKEN web reads, from a secret's file
    assert replaced["TOKEN_FILE"] == "/run/secrets/metrics_token"
    assert COMPOSE["secrets"]["metrics_token"] == {"environment": "METRICS_TOKEN"}
    assert WEB_ENV["METRICS_TOKEN"].startswith("${METRICS_TOKEN:?")
    assert replaced["ALERTMANAGER"] == "alertmanager:9093"
    assert config["alerting"]["alertmanagers"][0]["static_configs"] == [{"targets": ["alertmanager:9093"]}]
    assert argv[0] == "prometheus" and "--storage.tsdb.path=/prometheus" in argv


def test_alertmanager_posts_to_the_portals_receiver_with_its_token(tmp_path):
    replaced, argv, path = _filled("alertmanager", tmp_path)
    _check("amtool", "check-config", str(path))
    config = yaml.safe_load(path.read_text())
    (receiver,) = config["receivers"]
    (webhook,) = receiver["webhook_configs"]
    assert webhook["url"] == "http://web:8000/hooks/alertmanager"
    assert resolve("/hooks/alertmanager").url_name == "alertmanager-hook"
    assert replaced["TOKEN_FILE"] == "/run/secrets/alertmanager_token"
    assert COMPOSE["secrets"]["alertmanager_token"] == {"environment": "ALERTMANAGER_TOKEN"}
    assert WEB_ENV["ALERTMANAGER_TOKEN"].startswith("${ALERTMANAGER_TOKEN:?")
    assert argv[0] == "alertmanager" and "--storage.path=/alertmanager" in argv
