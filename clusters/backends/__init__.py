"""Scheduler backends (Slurm, Kubernetes, local) behind one interface: see DESIGN.md."""
