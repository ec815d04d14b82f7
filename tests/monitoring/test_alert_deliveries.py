"""Each kind of notification as its receiver reads it: WeCom's, DingTalk's and Feishu's group
robots (their documented bodies and signatures) and the generic signed webhook, on a loopback
endpoint; a refusal is retried, logged without the URL, and given up after the attempts."""

import base64
import hashlib
import hmac
import time
from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from monitoring.models import Alert, AlertChannel, AlertScope, Delivery, DeliveryStatus
from monitoring.services import IncomingAlert, alerts_receive, delivery_attempt
from tests.robots_support import robot_endpoint

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _loopback(settings):
    settings.ALERT_WEBHOOK_ALLOW_LOOPBACK = True


def fire(*, severity="critical", status="firing", starts=None, tenant="protein-lab") -> list[int]:
    """One grant alert of the tenant through the receiving service; the ids of its deliveries."""
    starts = starts or timezone.now() - timedelta(minutes=3)
    report = alerts_receive(
        [IncomingAlert(fingerprint="0f0f", status=status,
                       labels={"alertname": "GrantNearlySpent", "severity": severity, "scope": "tenant", "tenant": tenant},
                       annotations={"summary": "protein-lab has used 91% of its grant", "runbook": "Ask for more."},
                       starts_at=starts, ends_at=timezone.now() if status == "resolved" else None)]
    )  # fmt: skip
    return report.deliveries


def channel(tenant, kind, url, secret="", **fields) -> AlertChannel:
    return AlertChannel.objects.create(tenant=tenant, name=kind, kind=kind, url=url, secret=secret, **fields)


def test_wecom_gets_markdown(tenant, owner):
    with robot_endpoint() as robot:
        channel(tenant, "wecom", f"{robot.url}/cgi-bin/webhook/send?key=KEY-1")
        [_mail, robot_id] = fire()
        assert delivery_attempt(delivery_id=robot_id) is True
    [got] = robot.received
    assert got.path == "/cgi-bin/webhook/send" and got.query == {"key": "KEY-1"}
    body = got.json()
    assert body["msgtype"] == "markdown"
    assert (
        "GrantNearlySpent" in body["markdown"]["content"] and "Ask for more." in body["markdown"]["content"]
    )
    assert Delivery.objects.get(pk=robot_id).status == DeliveryStatus.SENT


def test_dingtalk_gets_a_signed_markdown_post(tenant, owner):
    secret = "SEC0123456789abcdef"
    with robot_endpoint() as robot:
        channel(tenant, "dingtalk", f"{robot.url}/robot/send?access_token=TOKEN-2", secret=secret)
        robot_id = fire()[-1]
        assert delivery_attempt(delivery_id=robot_id) is True
    [got] = robot.received
    assert got.query["access_token"] == "TOKEN-2"
    timestamp = got.query["timestamp"]
    assert abs(int(timestamp) / 1000 - time.time()) < 60  # milliseconds, as DingTalk wants
    # DingTalk's check: Base64(HMAC-SHA256(key=secret, "<timestamp>\n<secret>"))
    expected = base64.b64encode(
        hmac.new(secret.encode(), f"{timestamp}\n{secret}".encode(), hashlib.sha256).digest()
    )
    assert got.query["sign"] == expected.decode()
    assert got.json()["msgtype"] == "markdown" and got.json()["markdown"]["title"].startswith("[FIRING:1]")


def test_feishu_gets_a_signed_text_post(tenant, owner):
    secret = "feishu-secret"
    with robot_endpoint() as robot:
        robot.answers = [(200, {"code": 0, "msg": "success", "data": {}})]
        channel(tenant, "feishu", f"{robot.url}/open-apis/bot/v2/hook/HOOK-3", secret=secret)
        robot_id = fire()[-1]
        assert delivery_attempt(delivery_id=robot_id) is True
    body = robot.received[0].json()
    assert body["msg_type"] == "text" and "GrantNearlySpent" in body["content"]["text"]
    # Feishu's check: Base64(HMAC-SHA256(key="<timestamp>\n<secret>", message=""))
    key = f"{body['timestamp']}\n{secret}".encode()
    assert body["sign"] == base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def test_the_generic_webhook_is_signed_over_its_timestamp_and_body(tenant, owner):
    secret = "whsec-4"
    with robot_endpoint() as hook:
        hook.answers = [(204, {})]
        channel(tenant, "webhook", f"{hook.url}/portal-alerts", secret=secret)
        hook_id = fire()[-1]
        assert delivery_attempt(delivery_id=hook_id) is True
    [got] = hook.received
    timestamp = got.headers["X-Portal-Timestamp"]
    signed = hmac.new(secret.encode(), timestamp.encode() + b"." + got.body, hashlib.sha256).hexdigest()
    assert got.headers["X-Portal-Signature"] == f"sha256={signed}"
    body = got.json()
    assert body["event"] == "firing" and body["tenant"] == "protein-lab"
    assert body["alerts"][0]["name"] == "GrantNearlySpent" and body["alerts"][0]["severity"] == "critical"


def test_a_refusal_is_retried_logged_without_the_url_and_given_up_after_the_attempts(tenant, owner, settings):
    settings.ALERT_DELIVERY_ATTEMPTS = 3
    with robot_endpoint() as robot:
        robot.answers = [
            (200, {"errcode": 310000, "errmsg": "sign not match"}),
            (500, {}),
            (200, {"errcode": 0}),
        ]
        channel(tenant, "dingtalk", f"{robot.url}/robot/send?access_token=TOKEN-5", secret="s")
        robot_id = fire()[-1]
        assert delivery_attempt(delivery_id=robot_id) is False
        delivery = Delivery.objects.get(pk=robot_id)
        assert (delivery.status, delivery.attempts) == (DeliveryStatus.PENDING, 1)
        assert "310000" in delivery.last_error and "sign not match" in delivery.last_error
        assert delivery_attempt(delivery_id=robot_id) is False
        assert "HTTP 500" in Delivery.objects.get(pk=robot_id).last_error
        assert delivery_attempt(delivery_id=robot_id) is True
        assert delivery_attempt(delivery_id=robot_id) is None  # sent: a duplicate task does nothing
    delivery = Delivery.objects.get(pk=robot_id)
    assert (delivery.status, delivery.attempts, delivery.last_error) == (DeliveryStatus.SENT, 3, "")
    assert len(robot.received) == 3


def test_a_destination_that_never_answers_fails_after_the_attempts(tenant, owner, settings):
    settings.ALERT_DELIVERY_ATTEMPTS = 2
    with robot_endpoint() as robot:
        url = f"{robot.url}/robot/send?access_token=TOKEN-6"
    channel(tenant, "dingtalk", url)  # the endpoint is gone: connection refused
    robot_id = fire()[-1]
    assert delivery_attempt(delivery_id=robot_id) is False
    assert delivery_attempt(delivery_id=robot_id) is None
    delivery = Delivery.objects.get(pk=robot_id)
    assert delivery.status == DeliveryStatus.FAILED and delivery.attempts == 2
    assert "no answer" in delivery.last_error and "TOKEN-6" not in delivery.last_error


def test_a_channel_hears_only_of_alerts_at_its_minimum_severity(tenant, owner):
    channel(tenant, "wecom", "http://127.0.0.1:9/send?key=k", min_severity="critical")
    channel(tenant, "feishu", "http://127.0.0.1:9/hook", enabled=False)
    deliveries = Delivery.objects.filter(pk__in=fire(severity="warning"))
    assert [d.kind for d in deliveries] == ["mail"]


def test_the_mail_of_a_resolution_says_so(tenant, owner):
    starts = timezone.now() - timedelta(hours=1)
    fire(starts=starts)
    [resolved_id] = fire(starts=starts, status="resolved")
    assert delivery_attempt(delivery_id=resolved_id) is True
    sent = mail.outbox[-1]
    assert sent.subject == "[RESOLVED:1] GrantNearlySpent (protein-lab)"
    assert "is resolved" in sent.body
    assert Alert.objects.get().scope == AlertScope.TENANT
