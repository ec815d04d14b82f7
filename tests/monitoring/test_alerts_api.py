"""GET /api/v1/alerts/ and a tenant's alert channels: a tenant sees only its own alerts, a
platform alert only staff; a channel's URL and secret go in and never come out."""

from datetime import timedelta

import pytest
from django.utils import timezone

from monitoring.models import Alert, AlertChannel, AlertScope, Delivery
from portal.core.models import AuditEvent
from tests.api_support import assert_problem
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def make_alert(tenant=None, name="GpuMemoryHigh", fingerprint="aa", **fields) -> Alert:
    now = timezone.now()
    scope = AlertScope.TENANT if tenant else AlertScope.PLATFORM
    return Alert.objects.create(
        fingerprint=fingerprint, starts_at=now - timedelta(minutes=5), name=name, status="firing",
        severity="warning", scope=scope, tenant=tenant, received_last=now, labels={"alertname": name}, **fields,
    )  # fmt: skip


def test_a_tenant_sees_its_own_alerts_only(client_for, tenant, other_tenant, member, outsider):
    mine = make_alert(tenant, fingerprint="01")
    theirs = make_alert(other_tenant, fingerprint="02")
    platform = make_alert(None, name="ClusterUnreachable", fingerprint="03")
    client = client_for(member)
    listed = client.get("/api/v1/alerts/").json()["results"]
    assert [row["id"] for row in listed] == [mine.pk]
    assert listed[0]["tenant"] == "protein-lab" and listed[0]["status"] == "firing"
    assert client.get(f"/api/v1/alerts/{mine.pk}/").status_code == 200
    assert_problem(client.get(f"/api/v1/alerts/{theirs.pk}/"), 404, "not_found")
    assert_problem(client.get(f"/api/v1/alerts/{platform.pk}/"), 404, "not_found")
    assert client.get("/api/v1/alerts/?tenant=other-team").json()["results"] == []
    assert [r["id"] for r in client_for(outsider).get("/api/v1/alerts/").json()["results"]] == [theirs.pk]


def test_staff_who_read_every_tenant_see_every_alert_and_the_platforms(client_for, tenant, other_tenant):
    admin = UserFactory(username="root", is_staff=True, is_superuser=True)
    alerts = [
        make_alert(tenant, fingerprint="01"),
        make_alert(other_tenant, fingerprint="02"),
        make_alert(fingerprint="03"),
    ]
    listed = client_for(admin).get("/api/v1/alerts/?status=firing").json()["results"]
    assert sorted(row["id"] for row in listed) == sorted(a.pk for a in alerts)
    platform = client_for(admin).get("/api/v1/alerts/?scope=platform").json()["results"]
    assert [row["id"] for row in platform] == [alerts[2].pk]


def test_an_alert_shows_its_deliveries_without_addresses(client_for, tenant, owner):
    alert = make_alert(tenant)
    delivery = Delivery.objects.create(tenant=tenant, kind="mail", event="firing", title="t",
                                       recipients=["a@x.example", "b@x.example"], status="sent", attempts=1)  # fmt: skip
    delivery.alerts.add(alert)
    body = client_for(owner).get(f"/api/v1/alerts/{alert.pk}/").json()
    [shown] = body["deliveries"]
    assert shown["recipients"] == 2 and shown["status"] == "sent" and "a@x.example" not in str(body)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("status=loud", "status"),
        ("job=abc", "job"),
        ("job=0", "job"),
        ("job=-1.5", "job"),
        ("severity=x", "severity"),
    ],
)
def test_a_bad_filter_is_a_400_naming_it(client_for, member, query, field):
    problem = assert_problem(client_for(member).get(f"/api/v1/alerts/?{query}"), 400, "invalid")
    assert field in problem["errors"]


CHANNELS = "/api/v1/tenants/protein-lab/alert-channels/"


def test_owners_and_managers_keep_channels_and_never_read_their_url_or_secret(
    client_for, tenant, manager, settings
):
    settings.ALERT_WEBHOOK_ALLOW_LOOPBACK = True
    client = client_for(manager)
    body = {"name": "lab robot", "kind": "dingtalk", "url": "http://127.0.0.1:9/robot/send?access_token=SECRET1",
            "secret": "SECSIGN2"}  # fmt: skip
    made = client.post(CHANNELS, body, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["has_secret"] is True and "url" not in made.json()
    channel = AlertChannel.objects.get()
    assert channel.url.endswith("SECRET1") and channel.secret == "SECSIGN2"
    listed = client.get(CHANNELS).content.decode()
    assert "SECRET1" not in listed and "SECSIGN2" not in listed
    changed = client.patch(f"{CHANNELS}{channel.pk}/", {"min_severity": "critical"}, format="json")
    assert changed.status_code == 200 and changed.json()["min_severity"] == "critical"
    audit = list(AuditEvent.objects.filter(action__startswith="alert_channel.").values_list("action", "data"))
    assert sorted(action for action, _ in audit) == ["alert_channel.change", "alert_channel.create"]
    assert "SECRET1" not in str(audit) and "SECSIGN2" not in str(audit)
    assert client.delete(f"{CHANNELS}{channel.pk}/").status_code == 204
    assert not AlertChannel.objects.exists()


def test_a_second_channel_of_the_same_name_is_a_400_on_name_and_an_empty_patch_changes_nothing(
    client_for, tenant, owner, settings
):
    settings.ALERT_WEBHOOK_ALLOW_LOOPBACK = True
    client = client_for(owner)
    first = {"name": "robot", "kind": "wecom", "url": "http://127.0.0.1:9/send"}
    made = client.post(CHANNELS, first, format="json").json()
    other = client.post(CHANNELS, {**first, "name": "other"}, format="json").json()
    problem = assert_problem(client.post(CHANNELS, first, format="json"), 400, "invalid")
    assert list(problem["errors"]) == ["name"]
    renamed = client.patch(f"{CHANNELS}{other['id']}/", {"name": "robot"}, format="json")
    assert list(assert_problem(renamed, 400, "invalid")["errors"]) == ["name"]
    unchanged = client.patch(f"{CHANNELS}{made['id']}/")
    assert unchanged.status_code == 200 and unchanged.json() == made
    assert sorted(AlertChannel.objects.values_list("name", flat=True)) == ["other", "robot"]


def test_a_member_may_not_keep_channels_and_an_outsider_learns_nothing(client_for, tenant, member, outsider):
    body = {"name": "x", "kind": "wecom", "url": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=k"}
    assert_problem(client_for(member).post(CHANNELS, body, format="json"), 403, "permission_denied")
    assert_problem(client_for(member).get(CHANNELS), 403, "permission_denied")
    assert_problem(client_for(outsider).post(CHANNELS, {"junk": 1}, format="json"), 404, "not_found")


@pytest.mark.parametrize(
    ("kind", "url", "secret", "field"),
    [
        ("wecom", "https://evil.example/cgi-bin/webhook/send?key=k", "", "url"),  # not WeCom's host
        ("dingtalk", "http://oapi.dingtalk.com/robot/send?access_token=t", "", "url"),  # not https
        ("feishu", "https://open.feishu.cn:8443/open-apis/bot/v2/hook/x", "", "url"),  # another port
        ("webhook", "https://127.0.0.1/hook", "s", "url"),  # this machine
        ("webhook", "https://10.1.2.3/hook", "s", "url"),  # a private network
        ("webhook", "https://169.254.169.254/latest/meta-data", "s", "url"),  # a cloud's metadata
        ("webhook", "https://user:pw@hooks.example.com/x", "s", "url"),
        ("webhook", "https://93.184.215.14/hook", "", "secret"),  # unsigned
        ("pager", "https://93.184.215.14/hook", "s", "kind"),
    ],
)
def test_a_channel_may_point_only_where_it_is_safe_to_post(
    client_for, tenant, owner, kind, url, secret, field
):
    body = {"name": "x", "kind": kind, "url": url, "secret": secret}
    problem = assert_problem(client_for(owner).post(CHANNELS, body, format="json"), 400, "invalid")
    assert field in problem["errors"], problem
    assert not AlertChannel.objects.exists()
