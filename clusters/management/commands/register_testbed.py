"""Register the local Slurm testbed (tests/testbed/testbed.sh) as a cluster of the portal."""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from clusters.models import Cluster, ClusterKind, GpuModel, JobIdentity, Partition
from clusters.shares import ShareKind

# The testbed's GRES types and the catalog models they stand for.
GRES_MODELS = {"h100": "h100-80gb", "a100": "a100-80gb"}


def read_env(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


class Command(BaseCommand):
    help = "Create or update the cluster 'testbed' from the testbed's env file."

    def add_arguments(self, parser):
        parser.add_argument("--env-file", default=str(settings.BASE_DIR / "var" / "testbed" / "testbed.env"))

    def handle(self, *args, env_file: str, **options):
        path = Path(env_file)
        if not path.exists():
            raise CommandError(f"{path} does not exist: run `bash tests/testbed/testbed.sh up` first")
        env = read_env(path)
        cluster, _ = Cluster.objects.update_or_create(
            slug="testbed",
            defaults={
                "name": "Slurm testbed",
                "kind": ClusterKind.SLURM,
                "ssh_host": env["SLURM_TESTBED_HOST"],
                "ssh_port": int(env["SLURM_TESTBED_PORT"]),
                "ssh_user": env["SLURM_TESTBED_USER"],
                "ssh_known_hosts": Path(env["SLURM_TESTBED_KNOWN_HOSTS"]).read_text(),
                "ssh_private_key": Path(env["SLURM_TESTBED_KEY_FILE"]).read_text(),
                "slurm_cluster_name": env["SLURM_TESTBED_CLUSTER"],
                "scratch_root": env["SLURM_TESTBED_SCRATCH"],
                # each tenant's jobs run as pt-<slug> (`testbed.sh identity pt-<slug>` makes one)
                "job_identity": JobIdentity.TENANT,
                "tenant_identity_template": "pt-{tenant}",
                "healthy": True,
            },
        )
        for item in env["SLURM_TESTBED_PARTITIONS"].split(","):
            name, gres, gpus = item.split(":")
            Partition.objects.update_or_create(
                cluster=cluster,
                name=name,
                defaults={
                    "gpu_model": GpuModel.objects.get(slug=GRES_MODELS[gres]),
                    "gpus_per_node": int(gpus),
                    "nodes": int(env.get("SLURM_TESTBED_NODES", 1)),
                    "max_walltime_minutes": 24 * 60,
                    # The testbed's one node is a 2-core VM that declares 16 CPUs.
                    "max_cpus_per_gpu": 1,
                    "max_mem_per_gpu_mb": 1000,
                },
            )
        if share_partition := env.get("SLURM_TESTBED_SHARE_PARTITION"):
            # the node whose H200s are shared: whole, as MIG instances (typed GRES), as shards
            Partition.objects.update_or_create(
                cluster=cluster,
                name=share_partition,
                defaults={
                    "gpu_model": GpuModel.objects.get(slug="h200"),
                    "gpus_per_node": 2,
                    "nodes": 1,
                    "max_walltime_minutes": 24 * 60,
                    "max_cpus_per_gpu": 1,
                    "max_mem_per_gpu_mb": 1000,
                    "share_kinds": [ShareKind.WHOLE, ShareKind.MIG, ShareKind.SHARD],
                    "mig_profiles": ["3g.71gb", "1g.18gb"],
                    "shards_per_gpu": int(env["SLURM_TESTBED_SHARDS_PER_GPU"]),
                },
            )
        self.stdout.write(f"cluster testbed: {cluster.ssh_user}@{cluster.ssh_host}:{cluster.ssh_port}")
