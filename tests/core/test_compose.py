"""docker-compose.yml: no Docker engine runs here, so check that the file and the project agree."""

import re
import shlex

import pytest
import yaml
from django.core.management import get_commands

import portal.settings  # noqa: F401  (importing records every variable the settings read)
from portal.envvars import READ
from tests.conftest import ROOT

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
PORTAL_SERVICES = ["web", "worker", "beat"]


def argv(command) -> list[str]:
    words = shlex.split(command) if isinstance(command, str) else list(command)
    if words[:2] == ["sh", "-c"]:
        return [w for part in words[2].split("&&") for w in shlex.split(part.replace("exec ", "", 1))]
    return words


def test_the_stack_has_every_part():
    assert set(COMPOSE["services"]) == {"postgres", "redis", "proxy", *PORTAL_SERVICES}


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
