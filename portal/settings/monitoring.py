"""Monitoring (monitoring/; README, Monitoring): /metrics and Alertmanager's receiver."""

from portal.envvars import env_bool, env_int, env_secret, env_str

# --- Monitoring (monitoring/; README, Monitoring). /metrics answers only with
# `Authorization: Bearer <METRICS_TOKEN>`, and 404 while none is set. The processes share their
# counts through PROMETHEUS_MULTIPROC_DIR, which prometheus_client reads from the environment.
METRICS_TOKEN = env_secret("METRICS_TOKEN")
# Read here so that it is checked and listed; prometheus_client reads the environment itself.
PROMETHEUS_MULTIPROC_DIR = env_str("PROMETHEUS_MULTIPROC_DIR", "")
# POST /hooks/alertmanager answers only with `Authorization: Bearer <ALERTMANAGER_TOKEN>` (404
# while none is set). A notification is tried ALERT_DELIVERY_ATTEMPTS times, waiting 30 s,
# then twice as long each time, up to ALERT_DELIVERY_RETRY_MAX_S. A tenant's robots and webhooks
# post to public https addresses only; ALERT_WEBHOOK_ALLOW_LOOPBACK lets them post to this
# machine over http (development and tests, never production).
ALERTMANAGER_TOKEN = env_secret("ALERTMANAGER_TOKEN")
ALERT_DELIVERY_ATTEMPTS = env_int("ALERT_DELIVERY_ATTEMPTS", 5, minimum=1, maximum=20)
ALERT_DELIVERY_RETRY_MAX_S = env_int("ALERT_DELIVERY_RETRY_MAX_S", 3600, minimum=1)
ALERT_WEBHOOK_ALLOW_LOOPBACK = env_bool("ALERT_WEBHOOK_ALLOW_LOOPBACK", False)
