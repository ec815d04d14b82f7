"""What the API tests share: the check of a problem+json answer (docs/api.md, Conventions) and the body
of a quota request."""

from datetime import timedelta

from django.utils import timezone

PROBLEM_KEYS = {"type", "title", "status", "detail", "code"}


def assert_problem(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert set(body) >= PROBLEM_KEYS
    assert body["status"] == status
    assert body["code"] == code
    assert body["type"].endswith(code)
    return body


def request_body(**overrides) -> dict:
    """protein-lab asks for 8 H100s and 2000 GPU-hours for ai-training, from today for 90 days."""
    today = timezone.localdate()
    body = {
        "tenant": "protein-lab",
        "scenario": "ai-training",
        "gpu_model": "h100-80gb",
        "gpus": 8,
        "gpu_hours": 2000,
        "starts_on": str(today),
        "ends_on": str(today + timedelta(days=90)),
        "justification": "Fine-tune a 7B protein language model.",
    }
    return body | overrides
