"""Jobs and what follows them: limits, polling, the local cluster, logs, the event streams and
webhooks, the clusters' breakers, cleanup, idle GPUs and GPU readings."""

from portal.envvars import env_bool, env_int, env_list, env_str

# --- Jobs
JOB_MAX_WALLTIME_MINUTES = env_int("JOB_MAX_WALLTIME_MINUTES", 72 * 60, minimum=1)
JOB_POLL_INTERVAL_S = env_int("JOB_POLL_INTERVAL_S", 10, minimum=2, maximum=300)
JOB_DISPATCH_TIME_LIMIT_S = 150  # jobs.tasks.dispatch_job's hard limit
# A lease that ends before its dispatcher can is a second sbatch: the lease must outlast it.
JOB_DISPATCH_LEASE_S = env_int("JOB_DISPATCH_LEASE_S", 180, minimum=JOB_DISPATCH_TIME_LIMIT_S + 1)
JOB_LOST_GRACE_S = env_int("JOB_LOST_GRACE_S", 300, minimum=30)
FAIR_SHARE_HALF_LIFE_DAYS = env_int("FAIR_SHARE_HALF_LIFE_DAYS", 7, minimum=1)
# Preemption and restarts (docs/architecture/lending.md): how long a preemptible job outside any
# cohort is warned before a stop; a restarted job waits BACKOFF × 2^(restarts so far), at most
# BACKOFF_MAX; a job asks for at most JOB_MAX_RESTARTS restarts, a preemptible one gets
# JOB_PREEMPTIBLE_RESTARTS when it names none.
JOB_PREEMPT_GRACE_S = env_int("JOB_PREEMPT_GRACE_S", 300, minimum=10, maximum=3600)
JOB_RESTART_BACKOFF_S = env_int("JOB_RESTART_BACKOFF_S", 30, minimum=0, maximum=3600)
JOB_RESTART_BACKOFF_MAX_S = env_int("JOB_RESTART_BACKOFF_MAX_S", 1800, minimum=0, maximum=86_400)
JOB_MAX_RESTARTS = env_int("JOB_MAX_RESTARTS", 10, minimum=0, maximum=100)
JOB_PREEMPTIBLE_RESTARTS = env_int("JOB_PREEMPTIBLE_RESTARTS", 3, minimum=0, maximum=100)
LOCAL_CLUSTER_GPUS = env_int("LOCAL_CLUSTER_GPUS", 4, minimum=0, maximum=64)
# The local cluster reads its GPUs' utilization (idle GPUs) with this nvidia-smi.
LOCAL_NVIDIA_SMI = env_str("LOCAL_NVIDIA_SMI", "nvidia-smi")
# The local cluster's job sandbox (docs/architecture/local-sandbox.md): bubblewrap, the
# host's network or none, the uids of tenants when the portal runs as root, more read-only
# paths. Where no sandbox can be made the cluster serves one tenant only: LOCAL_CLUSTER_TENANT
# names it (it also restricts a sandboxed cluster to that tenant).
LOCAL_SANDBOX_BWRAP = env_str("LOCAL_SANDBOX_BWRAP", "/usr/bin/bwrap")
LOCAL_SANDBOX_NETWORK = env_bool("LOCAL_SANDBOX_NETWORK", False)
LOCAL_SANDBOX_UID_BASE = env_int("LOCAL_SANDBOX_UID_BASE", 1_900_000_000, minimum=1000, maximum=4_000_000_000)
LOCAL_SANDBOX_UID_COUNT = env_int("LOCAL_SANDBOX_UID_COUNT", 100_000, minimum=1, maximum=10_000_000)
LOCAL_SANDBOX_RO_PATHS = env_list("LOCAL_SANDBOX_RO_PATHS", [])
LOCAL_CLUSTER_TENANT = env_str("LOCAL_CLUSTER_TENANT", "")
JOB_LOG_MAX_BYTES = env_int("JOB_LOG_MAX_BYTES", 1_000_000, minimum=1000)
# Webhooks (webhooks/; docs/architecture.md, Webhooks): how often new events are scanned into
# deliveries, how long a failing delivery is retried, and how long an endpoint may fail before it
# is disabled. EVENTS_GAP_WAIT_S: how long a reader of new rows by id (the scan, the event
# stream) waits for an id it passed over because its row was not committed yet.
WEBHOOK_SCAN_INTERVAL_S = env_int("WEBHOOK_SCAN_INTERVAL_S", 5, minimum=1)
WEBHOOK_RETRY_FOR_S = env_int("WEBHOOK_RETRY_FOR_S", 86_400, minimum=60)
WEBHOOK_DISABLE_AFTER_S = env_int("WEBHOOK_DISABLE_AFTER_S", 86_400, minimum=60)
EVENTS_GAP_WAIT_S = env_int("EVENTS_GAP_WAIT_S", 30, minimum=1)
# Networks that deliveries may reach beside public addresses (CIDRs), with the console's
# "allowed webhook networks"; none by default (webhooks/outbound.py).
WEBHOOK_ALLOWED_RANGES = env_list("WEBHOOK_ALLOWED_RANGES", [])
# The event streams (jobs/stream.py; docs/architecture.md, Live events): how often new job events
# and a followed log are read, a keep-alive after this much silence, how long one stream lasts
# before the client reconnects (and its scope is checked again), how many missed events a
# reconnect replays, and how many streams one user may hold per ASGI process.
EVENTS_POLL_S = env_int("EVENTS_POLL_MS", 500, minimum=50) / 1000
EVENTS_LOG_POLL_S = env_int("EVENTS_LOG_POLL_MS", 2000, minimum=200) / 1000
EVENTS_HEARTBEAT_S = env_int("EVENTS_HEARTBEAT_S", 15, minimum=1)
EVENTS_STREAM_MAX_S = env_int("EVENTS_STREAM_MAX_S", 300, minimum=5)
EVENTS_BACKLOG = env_int("EVENTS_BACKLOG", 1000, minimum=10)
EVENTS_MAX_STREAMS_PER_USER = env_int("EVENTS_MAX_STREAMS_PER_USER", 20, minimum=1)

# --- One slow cluster stalls no other (clusters/breaker.py, docs/architecture/cluster-stall.md):
# after this many consecutive failures to reach a cluster, dispatch and poll skip it for a
# cool-off that doubles with each failed probe up to the cap; and at most this many dispatches
# and polls of one cluster hold a worker at once.
CLUSTER_BREAKER_FAILURES = env_int("CLUSTER_BREAKER_FAILURES", 3, minimum=1)
CLUSTER_BREAKER_COOLOFF_S = env_int("CLUSTER_BREAKER_COOLOFF_S", 30, minimum=1)
CLUSTER_BREAKER_COOLOFF_MAX_S = env_int(
    "CLUSTER_BREAKER_COOLOFF_MAX_S", 300, minimum=CLUSTER_BREAKER_COOLOFF_S
)
CLUSTER_WORKER_SLOTS = env_int("CLUSTER_WORKER_SLOTS", 2, minimum=1)

# --- Cleanup (docs/periodic-tasks.md): each is a service with a beat task that audits what it
# does; with CLEANUP_DRY_RUN every one of them reports what it would do and changes nothing.
CLEANUP_DRY_RUN = env_bool("CLEANUP_DRY_RUN", False)
# A job RUNNING longer than this is cancelled (reason walltime_cap), whatever it asked for.
JOB_WALLTIME_CAP_HOURS = env_int("JOB_WALLTIME_CAP_HOURS", 72, minimum=1)
# When a grant ends its waiting jobs are refused; its running jobs finish unless this is set.
GRANT_END_CANCEL_RUNNING = env_bool("GRANT_END_CANCEL_RUNNING", False)
# A suspended tenant gets no new work; its running jobs finish unless this is set.
SUSPENDED_CANCEL_RUNNING = env_bool("SUSPENDED_CANCEL_RUNNING", False)
# Files under a tenant's scratch directory older than this are deleted.
SCRATCH_PURGE_DAYS = env_int("SCRATCH_PURGE_DAYS", 30, minimum=1)
# Scheduler jobs carrying a portal token the portal does not know: reported, and cancelled if set.
ORPHAN_CANCEL = env_bool("ORPHAN_CANCEL", False)
# Finished jobs' events (all but the first and last) and the files the portal keeps of them.
JOB_EVENT_RETENTION_DAYS = env_int("JOB_EVENT_RETENTION_DAYS", 365, minimum=1)
JOB_LOG_RETENTION_DAYS = env_int("JOB_LOG_RETENTION_DAYS", 90, minimum=1)
# A job whose GPUs all stayed below the threshold for the window is flagged to its owner by mail,
# and cancelled (reason idle_gpus) after a second window when IDLE_GPU_CANCEL is set.
IDLE_GPU_THRESHOLD_PCT = env_int("IDLE_GPU_THRESHOLD_PCT", 5, minimum=0, maximum=100)
IDLE_GPU_WINDOW_MINUTES = env_int("IDLE_GPU_WINDOW_MINUTES", 120, minimum=1)
IDLE_GPU_CANCEL = env_bool("IDLE_GPU_CANCEL", False)
# GPU telemetry per job (jobs/services/telemetry.py): RUNNING jobs' GPUs read this often, and the
# readings kept this many days for the job page's charts and the API.
GPU_SAMPLE_INTERVAL_S = env_int("GPU_SAMPLE_INTERVAL_S", 60, minimum=10)
GPU_SAMPLE_KEEP_DAYS = env_int("GPU_SAMPLE_KEEP_DAYS", 30, minimum=1)
