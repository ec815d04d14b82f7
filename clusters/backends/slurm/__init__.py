"""The Slurm backend: SSH to a login node, sbatch/squeue/sacct/scancel/sacctmgr (docs/architecture.md).

ssh.py holds the pooled connection and runs commands, parse.py checks what goes out and reads
what comes back, accounts.py keeps tenants' accounts and limits, backend.py ties them together.
"""

from clusters.backends.slurm.backend import SlurmBackend

__all__ = ["SlurmBackend"]
