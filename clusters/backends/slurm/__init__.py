"""The Slurm backend: SSH to a login node, sbatch/squeue/sacct/scancel/sacctmgr (docs/architecture.md).

ssh.py holds the pooled connection and runs commands, parse.py checks what goes out and reads
what comes back, accounts.py keeps tenants' accounts and limits, sbatch.py builds a job's options
and script, submit.py submits jobs and finds them by token, status.py polls them, logs.py reads
and retires their logs, scratch.py purges scratch, cluster.py reads the cluster as a whole, and
backend.py ties them together.
"""

from clusters.backends.slurm.backend import SlurmBackend

__all__ = ["SlurmBackend"]
