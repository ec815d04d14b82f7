"""/healthz and /readyz."""

import pytest
from django.test import override_settings

pytestmark = pytest.mark.django_db


def test_healthz_answers_while_the_process_lives(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_is_ok_when_database_and_broker_answer(client, redis_server):
    with override_settings(CELERY_BROKER_URL=redis_server["url"]):
        response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"] == {"database": "ok", "broker": "ok"}


def test_readyz_names_a_stopped_broker(client, redis_server):
    redis_server["proc"].terminate()
    redis_server["proc"].wait(timeout=10)
    with override_settings(CELERY_BROKER_URL=redis_server["url"], READYZ_TIMEOUT_S=1):
        response = client.get("/readyz")
    assert response.status_code == 503
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["code"] == "unavailable"
    assert body["detail"] == "Not ready: broker unreachable."
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["broker"].startswith("failed")


def test_readyz_checks_the_embedded_broker_folder(client, tmp_path):
    folder = tmp_path / "queue"
    folder.mkdir()
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder)}
    with override_settings(CELERY_BROKER_URL="filesystem://", CELERY_BROKER_TRANSPORT_OPTIONS=options):
        assert client.get("/readyz").status_code == 200
        folder.rmdir()
        response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["detail"] == "Not ready: broker unreachable."
