"""Scheduler backends (Slurm, Kubernetes, local) behind one interface: see base.py."""

from importlib import import_module

from clusters.backends.base import Backend, ClusterConfig

# Cluster kind → "module:class"; imported on first use, so that a portal without Kubernetes
# clusters never imports the Kubernetes client.
REGISTRY = {
    "slurm": "clusters.backends.slurm:SlurmBackend",
    "local": "clusters.backends.local:LocalBackend",
    "kubernetes": "clusters.backends.kubernetes:KubernetesBackend",
}


def backend_for(config: ClusterConfig) -> Backend:
    try:
        module_name, class_name = REGISTRY[config.kind].split(":")
    except KeyError:
        raise ValueError(f"no backend for cluster kind {config.kind!r}") from None
    return getattr(import_module(module_name), class_name)(config)
