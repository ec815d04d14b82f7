"""What the Kubernetes backend's pure tests share: a cluster config and a job spec."""

from clusters.backends.base import ClusterConfig, JobSpec

TOKEN = "0123456789abcdef0123456789abcdef"


def make_config(**overrides) -> ClusterConfig:
    values = {
        "slug": "k8s-test",
        "kind": "kubernetes",
        "k8s_api_url": "https://k8s.example.org:6443",
        "k8s_token": "secret-token-value",
    }
    return ClusterConfig(**(values | overrides))


def make_spec(**overrides) -> JobSpec:
    values = {
        "token": TOKEN,
        "name": "train resnet",
        "account": "protein-lab",
        "qos": "portal-high",
        "priority": "normal",
        "partition": "NVIDIA-H100-80GB-HBM3",
        "gpu_type": "h100",
        "k8s_resource": "nvidia.com/gpu",
        "k8s_product": "NVIDIA-H100-80GB-HBM3",
        "gpus_per_node": 4,
        "nodes": 1,
        "walltime_minutes": 90,
        "script": "#!/bin/bash\nset -euo pipefail\npython train.py\n",
        "env": {"OMP_NUM_THREADS": "8", "NCCL_DEBUG": "WARN"},
        "cpus_per_gpu": 6,
        "mem_per_gpu_mb": 32_000,
        "labels": {"tenant": "protein-lab", "job": "42", "scenario": "ai-training"},
    }
    return JobSpec(**(values | overrides))
