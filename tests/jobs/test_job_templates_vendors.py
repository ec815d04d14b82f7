"""Job templates per accelerator vendor (jobs/job_templates, GpuModel.vendor): torchrun's backend
and collective variables for NVIDIA, AMD, Hygon, Huawei Ascend and Cambricon, the MD templates'
refusal where GROMACS and LAMMPS have no build, and the vendor reaching the template from a
submission (jobs/services/submit.py)."""

import shutil
import subprocess

import pytest

from clusters.models import Vendor
from jobs.job_templates import BACKEND_KINDS, TEMPLATES, VENDORS, render_template
from jobs.services import JobRequest, job_submit
from portal.core.errors import Invalid
from tests.factories import ClusterFactory, PartitionFactory, QuotaGrantFactory, catalog_pair
from tests.job_templates_support import FULL, MINIMAL, invalid

NPU_VENDORS = ("huawei", "cambricon")
GPU_VENDORS = ("nvidia", "amd", "hygon")

# What each vendor's torchrun script sets beyond the scenario's env, and what belongs to others.
COLLECTIVE = {
    "nvidia": ["export PORTAL_DIST_BACKEND=nccl\n"],
    "amd": [
        "export PORTAL_DIST_BACKEND=nccl\n",
        'HSA_FORCE_FINE_GRAIN_PCIE="${HSA_FORCE_FINE_GRAIN_PCIE:-1}"',
    ],
    "hygon": [
        "export PORTAL_DIST_BACKEND=nccl\n",
        'HSA_FORCE_FINE_GRAIN_PCIE="${HSA_FORCE_FINE_GRAIN_PCIE:-1}"',
    ],
    "huawei": [
        "export PORTAL_DIST_BACKEND=hccl\n",
        'HCCL_CONNECT_TIMEOUT="${HCCL_CONNECT_TIMEOUT:-1200}"',
        'HCCL_EXEC_TIMEOUT="${HCCL_EXEC_TIMEOUT:-1836}"',
        'export HCCL_SOCKET_IFNAME="$NCCL_SOCKET_IFNAME"',
        "ASCEND_RT_VISIBLE_DEVICES",
    ],
    "cambricon": ["export PORTAL_DIST_BACKEND=cncl\n"],
}
FOREIGN = {
    "nvidia": ["HSA_", "HCCL_", "CNCL_", "ASCEND_"],
    "amd": ["HCCL_", "CNCL_", "ASCEND_"],
    "hygon": ["HCCL_", "CNCL_", "ASCEND_"],
    "huawei": ["HSA_", "CNCL_"],
    "cambricon": ["HSA_", "HCCL_", "ASCEND_"],
}


def test_the_templates_know_the_catalog_s_vendors():
    # jobs/job_templates imports no Django, so it spells the vendors out; they must not drift.
    assert set(VENDORS) == set(Vendor.values)


def test_nvidia_is_the_default_vendor():
    for kind in BACKEND_KINDS:
        for slug in TEMPLATES:
            plain = render_template(slug, FULL[slug], nodes=1, gpus_per_node=2, backend_kind=kind)
            assert plain == render_template(
                slug, FULL[slug], nodes=1, gpus_per_node=2, backend_kind=kind, vendor="nvidia"
            )


def test_unknown_vendor_is_a_programming_error():
    # GpuModel.vendor has choices: anything else is a caller's bug, not input to explain.
    with pytest.raises(ValueError):
        render_template(
            "torchrun", {"script": "t.py"}, nodes=1, gpus_per_node=1, backend_kind="local", vendor="intel"
        )


# --- torchrun -----------------------------------------------------------------------------------


def torchrun_cases():
    for vendor in VENDORS:
        for kind in BACKEND_KINDS:
            for nodes in [1, 3] if kind in TEMPLATES["torchrun"].multi_node_backends else [1]:
                yield pytest.param(vendor, kind, nodes, id=f"{vendor}-{kind}-{nodes}n")


@pytest.mark.parametrize(("vendor", "kind", "nodes"), list(torchrun_cases()))
def test_torchrun_sets_its_vendor_s_collectives_and_no_other_s(vendor, kind, nodes, tmp_path):
    script = render_template(
        "torchrun", FULL["torchrun"], nodes=nodes, gpus_per_node=4, backend_kind=kind, vendor=vendor
    )
    for wanted in COLLECTIVE[vendor]:
        assert wanted in script, wanted
    for other in FOREIGN[vendor]:
        assert other not in script, other
    # Pinning is the backend's, with the vendor's own variables: the script sets none.
    assert "VISIBLE_DEVICES=" not in script
    nproc = '--nproc_per_node="$nproc" ' if vendor == "huawei" else "--nproc_per_node=4 "
    assert nproc in script
    # The variables come before the launcher, so that torchrun and its workers inherit them.
    assert script.index("PORTAL_DIST_BACKEND") < script.index("torchrun --")
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is required for these tests: apt-get install -y shellcheck"
    lint = subprocess.run(
        [shellcheck, "-S", "warning", "-s", "bash", str(path)], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize("vendor", VENDORS)
def test_vendor_defaults_leave_the_scenario_s_and_job_s_values_alone(vendor):
    script = render_template(
        "torchrun", {"script": "t.py"}, nodes=1, gpus_per_node=1, backend_kind="local", vendor=vendor
    )
    exports = [line for line in script.splitlines() if line.startswith("export ") and "PORTAL_" not in line]
    # Every variable the template sets beyond the backend's name is a default the env overrides.
    assert all(":-" in line for line in exports), exports


# --- Where a tool has no build ------------------------------------------------------------------


@pytest.mark.parametrize("vendor", NPU_VENDORS)
@pytest.mark.parametrize("slug", ["gromacs", "lammps"])
def test_md_templates_refuse_accelerators_their_tools_have_no_build_for(slug, vendor):
    errors = invalid(slug, MINIMAL[slug], vendor=vendor)
    assert list(errors) == ["gpu_model"]
    (message,) = errors["gpu_model"]
    name = {"huawei": "Huawei Ascend", "cambricon": "Cambricon"}[vendor]
    assert f"has no build for {name} accelerators" in message
    assert "NVIDIA, AMD or Hygon" in message


def test_the_vendor_refusal_comes_with_the_other_errors():
    errors = invalid("gromacs", {"maxwarn": -1}, nodes=2, backend_kind="local", vendor="huawei")
    assert set(errors) == {"gpu_model", "nodes", "parameters.maxwarn"}


@pytest.mark.parametrize("vendor", ["amd", "hygon"])
@pytest.mark.parametrize("slug", ["gromacs", "lammps"])
def test_md_templates_run_the_same_command_on_amd_and_hygon(slug, vendor):
    # The build (HIP or SYCL instead of CUDA) differs, not mdrun's or lmp's switches.
    for kind, nodes in (("slurm", 3), ("local", 1)):
        nvidia = render_template(slug, FULL[slug], nodes=nodes, gpus_per_node=4, backend_kind=kind)
        assert (
            render_template(slug, FULL[slug], nodes=nodes, gpus_per_node=4, backend_kind=kind, vendor=vendor)
            == nvidia
        )
    gromacs = render_template(
        "gromacs", {"pme": "gpu"}, nodes=1, gpus_per_node=1, backend_kind="local", vendor=vendor
    )
    assert "-nb gpu -pme gpu" in gromacs
    kokkos = render_template(
        "lammps", {"input": "in.lj"}, nodes=1, gpus_per_node=2, backend_kind="local", vendor=vendor
    )
    assert 'lmp -k on g 2 -sf kk -in "$lammps_input"' in kokkos
    gpu = render_template(
        "lammps",
        {"input": "in.lj", "accelerator": "gpu"},
        nodes=1,
        gpus_per_node=2,
        backend_kind="local",
        vendor=vendor,
    )
    assert 'lmp -sf gpu -pk gpu 2 -in "$lammps_input"' in gpu


@pytest.mark.parametrize("vendor", ["amd", "hygon"])
def test_lammps_cuda_build_is_refused_on_amd_and_hygon(vendor):
    params = {"input": "in.lj", "binary": "lmp_kokkos_cuda_mpi"}
    errors = invalid("lammps", params, vendor=vendor)
    assert list(errors) == ["parameters.binary"]
    assert "CUDA" in errors["parameters.binary"][0]
    assert render_template("lammps", params, nodes=1, gpus_per_node=1, backend_kind="local", vendor="nvidia")


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("slug", ["python", "horovod", "openfoam"])
def test_templates_without_vendor_specifics_render_alike_everywhere(slug, vendor):
    nvidia = render_template(slug, FULL[slug], nodes=1, gpus_per_node=2, backend_kind="local")
    assert (
        render_template(slug, FULL[slug], nodes=1, gpus_per_node=2, backend_kind="local", vendor=vendor)
        == nvidia
    )


# --- Through a submission -----------------------------------------------------------------------


def submit_template(tenant, user, *, scenario_slug, gpu_slug, template, parameters):
    scenario, gpu_model = catalog_pair(scenario_slug, gpu_slug)
    cluster = ClusterFactory(slug=f"local-{gpu_slug}", local_gpus=4)
    partition = PartitionFactory(cluster=cluster, gpu_model=gpu_model, gpus_per_node=4)
    QuotaGrantFactory(tenant=tenant, pair=(scenario, gpu_model))
    request = JobRequest(
        tenant=tenant, scenario=scenario, gpu_model=gpu_model, gpus=2, walltime_minutes=10, name="vendor",
        template=template, parameters=parameters, cluster=cluster, partition=partition.name,
    )  # fmt: skip
    job, _ = job_submit(user=user, request=request)
    return job


@pytest.mark.django_db
def test_a_submission_renders_for_its_gpu_model_s_vendor(tenant, member):
    job = submit_template(
        tenant, member, scenario_slug="ai-training", gpu_slug="mi250x", template="torchrun",
        parameters={"script": "train.py"},
    )  # fmt: skip
    assert "export PORTAL_DIST_BACKEND=nccl\n" in job.script
    assert "HSA_FORCE_FINE_GRAIN_PCIE" in job.script
    assert "--nproc_per_node=2 " in job.script


@pytest.mark.django_db
def test_a_submission_to_an_accelerator_without_a_build_names_the_gpu_model(tenant, member):
    with pytest.raises(Invalid) as raised:
        submit_template(
            tenant, member, scenario_slug="molecular-dynamics", gpu_slug="ascend-910b", template="gromacs",
            parameters={},
        )  # fmt: skip
    errors = raised.value.extra["errors"]
    assert list(errors) == ["gpu_model"]
    assert "Huawei Ascend" in errors["gpu_model"][0]
