"""The alert rules that ship with the portal (deploy/prometheus/): valid for Prometheus, every
alert unit-tested by `promtool test rules`, each carrying its routing labels and a runbook; the
example Prometheus and Alertmanager configurations valid once their placeholders are filled."""

import re
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import ROOT

PROM = ROOT / "deploy" / "prometheus"
RULES = PROM / "rules" / "portal.rules.yml"
UNIT_TESTS = sorted((PROM / "tests").glob("*.test.yml"))


def _rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def _run(*argv: str) -> subprocess.CompletedProcess:
    assert shutil.which(argv[0]), f"{argv[0]} is not installed (.ci/run installs it)"
    return subprocess.run(argv, cwd=PROM, capture_output=True, text=True, timeout=120, check=False)


def test_promtool_accepts_the_rules():
    done = _run("promtool", "check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_rule_passes_its_promtool_unit_tests():
    done = _run("promtool", "test", "rules", *map(str, UNIT_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(UNIT_TESTS)


def test_every_rule_has_unit_tests():
    tested_alerts, tested_exprs = set(), ""
    for path in UNIT_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            tested_alerts |= {check["alertname"] for check in case.get("alert_rule_test", [])}
            tested_exprs += " ".join(check["expr"] for check in case.get("promql_expr_test", []))
    alerts = {rule["alert"] for rule in _rules() if "alert" in rule}
    records = {rule["record"] for rule in _rules() if "record" in rule}
    assert alerts - tested_alerts == set(), "alerts without a promtool test"
    assert {record for record in records if record not in tested_exprs} == set(), "recordings without one"
    assert len(alerts) >= 10


def test_a_recording_is_read_only_after_it_within_its_own_group():
    # Prometheus evaluates groups concurrently (and promtool in a random order): a rule that read
    # a recording of another group would see the previous evaluation's value, or none at first.
    groups = yaml.safe_load(RULES.read_text())["groups"]
    recorded_in = {
        rule["record"]: group["name"] for group in groups for rule in group["rules"] if "record" in rule
    }
    for group in groups:
        seen = set()
        for rule in group["rules"]:
            for record, home in recorded_in.items():
                if re.search(rf"\b{re.escape(record)}\b", rule["expr"]):
                    assert home == group["name"] and record in seen, (rule.get("alert"), record)
            seen.add(rule.get("record"))


@pytest.mark.parametrize("rule", [r for r in _rules() if "alert" in r], ids=lambda r: r["alert"])
def test_every_alert_carries_its_routing_labels_and_a_runbook(rule):
    assert rule["labels"]["severity"] in {"warning", "critical"}
    assert rule["labels"]["scope"] in {"job", "tenant", "platform"}
    assert rule["annotations"]["summary"] and len(rule["annotations"]["runbook"]) > 40


def _filled(name: str, tmp_path, **values: str):
    text = (PROM / name).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    config = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"@[A-Z_]+@", config), f"{name}: a placeholder left:\n{config}"
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_example_prometheus_and_alertmanager_configurations_are_valid(tmp_path):
    token = tmp_path / "token"
    token.write_text("t")
    prometheus = _filled(
        "prometheus.yml", tmp_path, PORTAL="127.0.0.1:8000", TOKEN_FILE=str(token), DCGM="127.0.0.1:9400",
        CLUSTER="testbed", ALERTMANAGER="127.0.0.1:9093", RULES=str(RULES.parent),
    )  # fmt: skip
    done = _run("promtool", "check", "config", str(prometheus))
    assert done.returncode == 0, done.stdout + done.stderr
    alertmanager = _filled(
        "alertmanager.yml", tmp_path, PORTAL_URL="http://127.0.0.1:8000", TOKEN_FILE=str(token)
    )
    done = _run("amtool", "check-config", str(alertmanager))
    assert done.returncode == 0, done.stdout + done.stderr
