"""The local backend: jobs run as processes on the portal's own machine (docs/architecture.md, Backends).

statedir.py holds the state directory with the allocation file and its lock, submission.py the
checks and queue entry of a new job, processes.py the starting of waiting jobs, ends.py a job's
end and status read from its records, stopping.py the signals of cancel, warn and the walltime,
logs.py a job's output, launch.py the wrapper that outlives the worker and decides what it runs,
sandbox.py the bubblewrap sandbox a job runs in, records.py a job's records on disk, cleanup.py
the scratch purge and log retention, devices.py the accelerators the vendors' tools list (MIG
devices included), allocation.py what of them a job's share gets, gpus.py the GPU telemetry;
backend.py ties them together.
"""

from clusters.backends.local.backend import LocalBackend

__all__ = ["LocalBackend"]
