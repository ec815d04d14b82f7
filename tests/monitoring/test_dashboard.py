"""The Grafana dashboard docker-compose.yml provisions (deploy/grafana/): it has the panels the
README promises, every PromQL expression in it is valid for the real promtool, every series it
reads is one the portal exposes, a DCGM field, a recording rule of portal.rules.yml, `ALERTS` or
`up`, its threshold lines are the alert rules' thresholds, and Grafana finds it and its data
source where docker-compose.yml puts them."""

import json
import re
import shutil
import subprocess

import pytest
import yaml
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT
from tests.monitoring_support import TOKEN, scrape

GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = json.loads((GRAFANA / "dashboards" / "gpu-portal.json").read_text())
DATASOURCES = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
PROVIDERS = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "gpu-portal.yml").read_text())
RULES = yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules" / "portal.rules.yml").read_text())
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())

# Grafana's own variables, and a literal that stands for any of ours (all of them are regexes
# matched with =~, whose "All" is .*), so that promtool can parse what Grafana would send.
GRAFANA_VARIABLES = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
PROMQL_WORDS |= {"group_left", "group_right", "inf", "nan"}

# Each panel the README promises → series it must read.
PANELS = {
    "API request rate": {"portal_http_request_duration_seconds_count"},
    "API latency P50 / P99 by route": {"portal_http_request_duration_seconds_bucket"},
    "Throttled and failed requests": {
        "portal_http_requests_throttled_total",
        "portal_http_requests_failed_total",
    },
    "Celery queue depth": {"portal_celery_queue_messages"},
    "Celery task failures and retries": {"portal_celery_task_runs_total"},
    "Celery task duration P99": {"portal_celery_task_duration_seconds_bucket"},
    "Dispatch cycle duration": {"portal_dispatch_cycle_duration_seconds_bucket"},
    "Dispatch outcomes per cluster": {"portal_dispatch_jobs_total"},
    "Poll cycle duration": {"portal_poll_cycle_duration_seconds_bucket"},
    "Cluster up": {"portal_cluster_up"},
    "Cluster errors": {"portal_cluster_errors_total"},
    "Jobs by state per cluster": {"portal_jobs"},
    "Tenant GPUs in use": {"portal_tenant_gpus_in_use"},
    "Grant GPU-hours used vs granted": {"portal_grant_gpu_hours_used", "portal_grant_gpu_hours"},
    "GPU utilization": {"DCGM_FI_DEV_GPU_UTIL"},
    "GPU memory used": {"portal:gpu_memory_used:percent"},
    "GPU temperature": {"DCGM_FI_DEV_GPU_TEMP"},
    "GPU power": {"DCGM_FI_DEV_POWER_USAGE"},
    "GPU XID errors": {"DCGM_FI_DEV_XID_ERRORS"},
    "DCGM exporters up": {"up"},
    "Firing alerts": {"ALERTS"},
}


def _panels() -> list[dict]:
    """Every panel, those inside a collapsed row included."""
    found = []
    for panel in DASHBOARD["panels"]:
        found.append(panel)
        found += panel.get("panels", [])
    return found


PANEL = {panel["title"]: panel for panel in _panels()}


def _variable_queries() -> list[tuple[str, str]]:
    """(variable, metric) for each `label_values(metric, label)` of the templating."""
    found = []
    for variable in DASHBOARD["templating"]["list"]:
        match = re.fullmatch(r"label_values\((.+), *(\w+)\)", variable["query"])
        assert match and match[2] == variable["name"], variable["query"]
        found.append((variable["name"], match[1]))
    return found


OUR_VARIABLES = [name for name, _ in _variable_queries()]


def _expressions() -> list[tuple[str, str]]:
    """(where, PromQL) for every query of the dashboard: the panels' targets and the metric
    each template variable lists the values of."""
    found = [(panel["title"], target["expr"]) for panel in _panels() for target in panel.get("targets", [])]
    return found + [(f"${name}", metric) for name, metric in _variable_queries()]


def _promql(expr: str) -> str:
    """The expression as Grafana sends it, with a literal for each variable."""
    values = GRAFANA_VARIABLES | dict.fromkeys(OUR_VARIABLES, ".*")
    for name, value in sorted(values.items(), key=lambda item: -len(item[0])):
        expr = expr.replace("${" + name + "}", value).replace("$" + name, value)
    assert "$" not in expr, f"a variable the dashboard does not define: {expr}"
    return expr


def _metric_names(expr: str) -> set[str]:
    """The series an expression reads: its identifiers that are no function, aggregation,
    keyword, label (in braces or grouping clauses), string or duration."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for token in re.finditer(r"[A-Za-z_:][\w:]*|\d[\w.]*", expr):
        word, rest = token[0], expr[token.end() :].lstrip()
        if word[0].isdigit() or word.lower() in PROMQL_WORDS or rest.startswith("("):
            continue
        names.add(word)
    return names


def test_metric_names_are_told_from_functions_labels_and_strings():
    expr = (
        'histogram_quantile(0.99, sum by (route, le) (rate(a_bucket{route=~"api/.*", x="b c"}[5m])))'
        " / on (job) group_left (le) portal:b:percent > bool 1e3 or vector(0) unless count (c)"
    )
    assert _metric_names(expr) == {"a_bucket", "portal:b:percent", "c"}


def _recordings() -> set[str]:
    return {rule["record"] for group in RULES["groups"] for rule in group["rules"] if "record" in rule}


def _promtool_check_rules(tmp_path, exprs: list[str]) -> subprocess.CompletedProcess:
    assert shutil.which("promtool"), "promtool is not installed (.ci/run installs it)"
    path = tmp_path / "dashboard.rules.yml"
    rules = [{"record": f"dashboard:query_{n}", "expr": expr} for n, expr in enumerate(exprs)]
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    return subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


def test_every_expression_of_the_dashboard_is_valid_promql(tmp_path):
    # Each query becomes a recording rule, which `promtool check rules` parses as Prometheus does.
    exprs = [_promql(expr) for _, expr in _expressions()]
    done = _promtool_check_rules(tmp_path, exprs)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in done.stdout


@pytest.mark.parametrize("broken", ["sum by (cluster (portal_jobs)", "rate(portal_jobs_ended_total)"])
def test_promtool_refuses_an_invalid_expression_so_the_check_above_bites(tmp_path, broken):
    done = _promtool_check_rules(tmp_path, [broken])
    assert done.returncode != 0


@pytest.mark.parametrize(("title", "needs"), sorted(PANELS.items()))
def test_the_dashboard_has_each_promised_panel_reading_its_series(title, needs):
    assert title in PANEL, f"no panel {title!r}"
    read = set().union(*(_metric_names(target["expr"]) for target in PANEL[title]["targets"]))
    assert needs <= read, (title, read)


def test_latency_is_p50_and_p99_by_route_from_the_request_histogram():
    exprs = " ".join(target["expr"] for target in PANEL["API latency P50 / P99 by route"]["targets"])
    for quantile in ("0.5", "0.99"):
        assert re.search(
            rf"histogram_quantile\({quantile}, sum by \(route, le\) \(rate\(portal_http_request_duration_seconds_bucket",
            exprs,
        ), quantile


def test_the_alerts_panel_lists_the_firing_ones():
    (target,) = PANEL["Firing alerts"]["targets"]
    assert target["expr"] == 'ALERTS{alertstate="firing"}'


@pytest.mark.django_db
@override_settings(METRICS_TOKEN=TOKEN)
def test_every_series_the_dashboard_reads_exists(client):
    exposed = set()
    for family in text_string_to_metric_families(scrape(client)):
        if family.type == "counter":
            exposed.add(f"{family.name}_total")
        elif family.type == "histogram":
            exposed |= {f"{family.name}_bucket", f"{family.name}_count", f"{family.name}_sum"}
        else:
            exposed.add(family.name)
    known = {name for name in exposed if name.startswith("portal_")} | _recordings() | {"ALERTS", "up"}
    unknown = {
        (where, name)
        for where, expr in _expressions()
        for name in _metric_names(expr)
        if name not in known and not name.startswith("DCGM_FI_")
    }
    assert unknown == set()
    assert {"portal_jobs", "portal_http_request_duration_seconds_bucket"} <= known  # the scrape was read


def test_the_cluster_and_tenant_variables_filter_the_panels():
    assert set(OUR_VARIABLES) == {"cluster", "tenant"}
    exprs = [expr for where, expr in _expressions() if not where.startswith("$")]
    assert sum('cluster=~"$cluster"' in expr for expr in exprs) >= 10
    assert sum('tenant=~"$tenant"' in expr for expr in exprs) >= 3
    for variable in DASHBOARD["templating"]["list"]:
        assert variable["multi"] and variable["includeAll"] and variable["allValue"] == ".*"


def _rule_threshold(alert: str) -> float:
    rules = [rule for group in RULES["groups"] for rule in group["rules"]]
    (expr,) = [rule["expr"] for rule in rules if rule.get("alert") == alert]
    return float(re.search(r"[<>]=? *([\d.]+)", expr)[1])


@pytest.mark.parametrize(
    ("title", "alert", "scale"),
    [
        ("GPU memory used", "GpuMemoryHigh", 1),
        ("GPU memory used", "GpuMemoryCritical", 1),
        ("GPU temperature", "GpuTemperatureHigh", 1),
        ("API latency P50 / P99 by route", "PortalApiLatencyHigh", 1),
        ("API P99 (5 min)", "PortalApiLatencyHigh", 1),
        ("Celery queue depth", "CeleryBacklogGrowing", 1),
        ("Grant GPU-hours used vs granted", "GrantNearlySpent", 100),  # a ratio in the rule, % here
    ],
)
def test_threshold_lines_are_the_alert_rules_thresholds(title, alert, scale):
    steps = PANEL[title]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert _rule_threshold(alert) * scale in {step["value"] for step in steps}


def test_every_query_uses_the_provisioned_prometheus():
    (source,) = DATASOURCES["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    for panel in _panels():
        for owner in [panel, *panel.get("targets", [])]:
            if "datasource" in owner:
                assert owner["datasource"] == {"type": "prometheus", "uid": source["uid"]}, panel["title"]
    for variable in DASHBOARD["templating"]["list"]:
        assert variable["datasource"]["uid"] == source["uid"]
    # The compose service, on the port Prometheus listens on (its default; published to loopback).
    assert source["url"] == "http://prometheus:9090"
    assert "127.0.0.1:9090:9090" in COMPOSE["services"]["prometheus"]["ports"]


def _mounts(service: str) -> dict[str, str]:
    """Container path → the repository's path, for each bind mount of a compose service."""
    found = {}
    for volume in COMPOSE["services"][service]["volumes"]:
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            found[target] = source[2:]
    return found


def test_grafana_finds_the_provisioning_and_the_dashboard_where_compose_mounts_them():
    mounts = _mounts("grafana")
    assert mounts["/etc/grafana/provisioning"] == "deploy/grafana/provisioning"
    (provider,) = PROVIDERS["providers"]
    assert provider["type"] == "file" and provider["allowUiUpdates"] is False
    folder = mounts[provider["options"]["path"]]
    assert (ROOT / folder / "gpu-portal.json").is_file()
    home = COMPOSE["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/gpu-portal.json"
    ids = [panel["id"] for panel in _panels()]
    assert len(ids) == len(set(ids)) and DASHBOARD["uid"] == "gpu-portal"
