"""The API's answers (docs/api.md) as the CLI reads them: TypedDicts of the JSON objects, so that
`--json` prints them as the API gave them, and the job states."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

END_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REJECTED",
        "LOST",
    }
)
JOB_STATES = ("QUEUED", "SUBMITTING", "PENDING", "RUNNING", "CANCELLING", *sorted(END_STATES))


class Problem(TypedDict):
    type: str
    title: str
    status: int
    detail: str
    code: str
    errors: NotRequired[dict[str, list[str]]]
    retry_after_s: NotRequired[int]


class TokenCreated(TypedDict):
    id: str
    name: str
    token: str
    scope: str
    created: str
    expires: str


class MeTenant(TypedDict):
    slug: str
    name: str
    role: str


class Me(TypedDict):
    username: str
    email: str
    is_staff: bool
    platform_admin: bool
    staff_roles: list[str]
    tenants: list[MeTenant]


class Tenant(TypedDict):
    slug: str
    name: str
    tier: str
    state: str
    contact_email: str
    created: str


class Quota(TypedDict):
    id: str
    tenant: str
    scenario: str
    gpu_model: str
    gpus: int
    gpus_in_use: int
    gpu_hours: float
    gpu_hours_used: float
    gpu_hours_reserved: float
    gpu_hours_remaining: float
    starts_on: str
    ends_on: str
    active: bool


class ScenarioGpu(TypedDict):
    gpu_model: str
    rank: int
    reason: str


class Scenario(TypedDict):
    slug: str
    name: str
    description: str
    default_walltime_minutes: int
    env: dict[str, str]
    gpu_models: list[ScenarioGpu]
    advisor: str


class AdviceOption(TypedDict):
    gpu_model: str
    gpus: int
    nodes: int
    gpu_hours: float
    arithmetic: list[str]


class Advice(TypedDict):
    assumptions: list[str]
    options: list[AdviceOption]


class Template(TypedDict):
    slug: str
    scenario: str
    name: str
    description: str
    parameters_schema: dict[str, Any]


class Job(TypedDict):
    id: str
    tenant: str
    name: str
    scenario: str
    gpu_model: str
    gpus: int
    nodes: int
    share: str
    mig_profile: str
    gpu_memory_mib: int
    gpu_cores_pct: int
    device_fraction: float
    walltime_minutes: int
    priority: str
    state: str
    reason: str
    cluster: str
    partition: str
    backend_id: str
    submitted_by: str | None
    created: str
    started_at: str | None
    finished_at: str | None
    exit_code: int | None
    gpu_hours: float | None
    gpu_hours_reserved: float
    # GET /jobs/{id}/ for the submitter, owners and managers only:
    raw_state: NotRequired[str]
    node_list: NotRequired[str]
    template: NotRequired[str]
    parameters: NotRequired[dict[str, Any]]
    env: NotRequired[dict[str, str]]
    script: NotRequired[str]


class JobEvent(TypedDict):
    at: str
    from_state: str
    to_state: str
    reason: str
    raw_state: str


class Log(TypedDict):
    lines: list[str]
    truncated: bool


class UsageRow(TypedDict):
    key: str
    gpu_hours: float


class Usage(TypedDict):
    results: list[UsageRow]


GroupBy = Literal["day", "user", "gpu_model"]
