"""The local backend: jobs run as processes on the portal's own machine (docs/architecture.md, Backends).

launch.py holds the wrapper that outlives the worker and decides what it runs, sandbox.py the
bubblewrap sandbox a job runs in, records.py a job's records on disk, cleanup.py the scratch
purge and log retention, devices.py the accelerators the vendors' tools list (MIG devices
included), allocation.py what of them a job's share gets, gpus.py the GPU telemetry; backend.py
ties them together.
"""

from clusters.backends.local.backend import LocalBackend

__all__ = ["LocalBackend"]
