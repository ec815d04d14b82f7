"""What a notification says and how it reaches each kind of destination: mail, the group robots
of WeCom, DingTalk and Feishu (their documented webhook formats and signatures), and a generic
JSON webhook signed with HMAC-SHA256.

A channel's URL is the tenant's input, and the worker posts to it: only https to a robot's own
host, or to a public address for a generic webhook (never to this machine, a private network or
a link-local address such as a cloud's metadata service), no redirect followed. The URL and the
secret are never written to a log or an error (a robot's URL carries its key)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import socket
import time
import urllib.error
import urllib.request
from urllib.parse import quote, urlsplit

from django.conf import settings
from django.core.mail import send_mail
from django.template.loader import render_to_string
from django.utils import translation

from monitoring.models import Alert, ChannelKind, Delivery, DeliveryKind

ROBOT_HOSTS = {
    ChannelKind.WECOM: {"qyapi.weixin.qq.com"},
    ChannelKind.DINGTALK: {"oapi.dingtalk.com"},
    ChannelKind.FEISHU: {"open.feishu.cn", "open.larksuite.com"},
}
TIMEOUT_S = 10.0
MAX_TEXT = 3800  # WeCom's markdown takes 4096 bytes; the others more
SIGNATURE_HEADER = "X-Portal-Signature"
TIMESTAMP_HEADER = "X-Portal-Timestamp"


class DeliveryError(Exception):
    """A destination refused or did not answer; the message never holds the URL or secret."""


# --- Where a channel may point


def _loopback_allowed() -> bool:
    return settings.ALERT_WEBHOOK_ALLOW_LOOPBACK


def channel_url_problem(kind: str, url: str) -> str | None:
    """Why a channel of this kind may not post to the URL, or None. Checked when it is saved and
    again before every post (an address may change)."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return "is not a URL"
    if parts.username or parts.password:
        return "must not hold a user or password"
    if not host:
        return "has no host"
    loopback = _loopback_allowed() and host in {"127.0.0.1", "localhost", "::1"}
    if parts.scheme != "https" and not (loopback and parts.scheme == "http"):
        return "must be https"
    if kind in ROBOT_HOSTS and not loopback and (host not in ROBOT_HOSTS[kind] or port not in (None, 443)):
        return f"must be on {' or '.join(sorted(ROBOT_HOSTS[kind]))}"
    if loopback:
        return None
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, port or 443, proto=socket.IPPROTO_TCP)}
    except OSError:
        return "has a host that does not resolve"
    if not all(ipaddress.ip_address(address.split("%")[0]).is_global for address in addresses):
        return "must point to a public address"
    return None


# --- What it says


def _job_url(alert: Alert) -> str:
    if alert.job_id is None or alert.tenant is None:
        return ""
    return f"{settings.SITE_URL}/t/{alert.tenant.slug}/jobs/{alert.job_id}/"


def alert_lines(delivery: Delivery) -> list[dict]:
    """The alerts of a delivery as plain data: what every format is written from."""
    rows = []
    for alert in delivery.alerts.select_related("tenant", "cluster").order_by("name", "id"):
        rows.append(
            {
                "name": alert.name,
                "status": alert.status,
                "severity": alert.severity,
                "summary": alert.summary,
                "runbook": alert.runbook,
                "tenant": alert.tenant.slug if alert.tenant else None,
                "cluster": alert.cluster.slug if alert.cluster else alert.labels.get("cluster"),
                "job_id": alert.job_id,
                "job_url": _job_url(alert),
                "starts_at": alert.starts_at.isoformat(),
                "ends_at": alert.ends_at.isoformat() if alert.ends_at else None,
            }
        )
    return rows


def markdown_of(delivery: Delivery, rows: list[dict]) -> str:
    """The robots' text: a title line, then one item per alert, each with its runbook."""
    resolved = delivery.event == "resolved"
    lines = [f"**{delivery.title}**", ""]
    for row in rows:
        mark = "✅" if resolved else ("🔴" if row["severity"] == "critical" else "🟠")
        lines.append(f"{mark} **{row['name']}** ({row['severity']}): {row['summary']}")
        if row["job_url"]:
            lines.append(f"> job {row['job_id']}: {row['job_url']}")
        if resolved:
            lines.append(f"> resolved at {row['ends_at']}")
        elif row["runbook"]:
            lines.append(f"> {row['runbook']}")
    text = "\n".join(lines)
    return text if len(text.encode()) <= MAX_TEXT else text.encode()[:MAX_TEXT].decode(errors="ignore") + "…"


# --- How it goes


def _no_redirects() -> urllib.request.OpenerDirector:
    class Refuse(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None  # a 3xx is an answer, and a failed delivery: a redirect could lead anywhere

    return urllib.request.build_opener(Refuse)


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(  # noqa: S310 - checked by channel_url_problem
        url, data=body, headers={"Content-Type": "application/json", **headers}, method="POST"
    )
    try:
        with _no_redirects().open(request, timeout=TIMEOUT_S) as response:
            return response.status, response.read(65536)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(2048)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DeliveryError(f"no answer: {type(reason).__name__}") from None


def _dingtalk_url(url: str, secret: str) -> str:
    if not secret:
        return url
    timestamp = str(int(time.time() * 1000))
    digest = hmac.new(secret.encode(), f"{timestamp}\n{secret}".encode(), hashlib.sha256).digest()
    sign = quote(base64.b64encode(digest).decode(), safe="")
    return f"{url}{'&' if '?' in url else '?'}timestamp={timestamp}&sign={sign}"


def feishu_sign(timestamp: str, secret: str) -> str:
    """Feishu's robot signature: HMAC-SHA256 keyed by "<timestamp>\\n<secret>" over nothing."""
    return base64.b64encode(
        hmac.new(f"{timestamp}\n{secret}".encode(), b"", hashlib.sha256).digest()
    ).decode()


def webhook_signature(secret: str, timestamp: str, body: bytes) -> str:
    """The generic webhook's signature header: sha256=HMAC(secret, "<timestamp>." + body), hex."""
    return "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def _robot_ok(status: int, answer: bytes, code_field: str) -> None:
    if not 200 <= status < 300:
        raise DeliveryError(f"answered HTTP {status}")
    try:
        data = json.loads(answer)
    except ValueError:
        raise DeliveryError("answered something that is not JSON") from None
    code = data.get(code_field, data.get("StatusCode"))
    if code != 0:
        message = str(data.get("errmsg") or data.get("msg") or "")[:200]
        raise DeliveryError(f"refused: {code_field} {code}: {message}")


def deliver(delivery: Delivery) -> None:
    """Send one delivery once; DeliveryError says why it did not go."""
    rows = alert_lines(delivery)
    if delivery.kind == DeliveryKind.MAIL:
        _mail(delivery, rows)
        return
    channel = delivery.channel
    if channel is None or not channel.enabled:
        raise DeliveryError("the channel was removed or disabled")
    if problem := channel_url_problem(channel.kind, channel.url):
        raise DeliveryError(f"the channel's URL {problem}")
    text = markdown_of(delivery, rows)
    if channel.kind == ChannelKind.WECOM:
        body = {"msgtype": "markdown", "markdown": {"content": text}}
        _robot_ok(*_post(channel.url, json.dumps(body).encode(), {}), code_field="errcode")
    elif channel.kind == ChannelKind.DINGTALK:
        body = {"msgtype": "markdown", "markdown": {"title": delivery.title[:64], "text": text}}
        url = _dingtalk_url(channel.url, channel.secret)
        _robot_ok(*_post(url, json.dumps(body).encode(), {}), code_field="errcode")
    elif channel.kind == ChannelKind.FEISHU:
        body = {"msg_type": "text", "content": {"text": text.replace("**", "")}}
        if channel.secret:
            timestamp = str(int(time.time()))
            body |= {"timestamp": timestamp, "sign": feishu_sign(timestamp, channel.secret)}
        _robot_ok(*_post(channel.url, json.dumps(body).encode(), {}), code_field="code")
    else:
        payload = {
            "version": "1",
            "event": delivery.event,
            "title": delivery.title,
            "tenant": delivery.tenant.slug if delivery.tenant else None,
            "alerts": rows,
        }
        body = json.dumps(payload, separators=(",", ":")).encode()
        timestamp = str(int(time.time()))
        headers = {
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: webhook_signature(channel.secret, timestamp, body),
        }
        status, _answer = _post(channel.url, body, headers)
        if not 200 <= status < 300:
            raise DeliveryError(f"answered HTTP {status}")


def _mail(delivery: Delivery, rows: list[dict]) -> None:
    context = {"delivery": delivery, "alerts": rows, "resolved": delivery.event == "resolved",
               "site_url": settings.SITE_URL}  # fmt: skip
    with translation.override(settings.MAIL_LANGUAGE):
        body = render_to_string("mail/alerts.txt", context)
    try:
        send_mail(delivery.title, body, None, delivery.recipients)
    except Exception as exc:
        raise DeliveryError(f"mail: {type(exc).__name__}: {str(exc)[:200]}") from None
