"""clusters/gpu_metrics.py: nvidia-smi's CSV and NVML's figures read from the real captures of an
H200 (tests/fixtures/nvidia-smi/h200), and DCGM exporter series matched to Slurm and Kubernetes
jobs. Through a real Prometheus: tests/monitoring/test_prometheus_stack.py."""

import json
import math
import re
import xml.etree.ElementTree as ET

import pytest

from clusters.backends.base import GpuSample
from clusters.backends.local.devices import parse_nvidia_smi_list
from clusters.backends.local.gpus import nvml_reading
from clusters.gpu_metrics import (
    COMPUTE_APPS_FIELDS,
    DCGM_METRICS,
    QUERY_COMPUTE_APPS_ARGS,
    QUERY_GPU_ARGS,
    GpuMetricsError,
    GpuReading,
    dcgm_job_samples,
    dcgm_promql,
    fetch_metrics,
    parse_compute_apps,
    parse_prometheus_text,
    parse_query_gpu,
    samples_by_index,
)
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi" / "h200"
H200_UUID = "GPU-75bdf912-4cc4-0a16-d75d-86bb37ecacb3"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# --- nvidia-smi, real output


def test_the_queries_are_the_ones_the_fixtures_were_captured_with():
    readme = fixture("README.md")
    assert f"`nvidia-smi {' '.join(QUERY_GPU_ARGS)}`" in readme
    assert f"`nvidia-smi {' '.join(QUERY_COMPUTE_APPS_ARGS)}`" in readme
    assert COMPUTE_APPS_FIELDS == ("pid", "gpu_uuid", "used_memory", "process_name")


def test_query_gpu_of_an_idle_h200():
    assert parse_query_gpu(fixture("query-gpu-idle.csv")) == [
        GpuReading(
            index=0, uuid=H200_UUID, name="NVIDIA H200", utilization_pct=0.0,
            memory_used_mib=0.0, memory_total_mib=143771.0, temperature_c=40.0, power_w=126.52,
        )
    ]  # fmt: skip


def test_query_gpu_of_a_busy_h200():
    [gpu] = parse_query_gpu(fixture("query-gpu-busy.csv"))
    assert (gpu.index, gpu.uuid, gpu.name) == (0, H200_UUID, "NVIDIA H200")
    assert (gpu.utilization_pct, gpu.memory_used_mib, gpu.memory_total_mib) == (100.0, 1011.0, 143771.0)
    assert (gpu.temperature_c, gpu.power_w, gpu.xid) == (65.0, 692.1, None)


def test_the_busy_csv_agrees_with_nvidia_smis_own_xml_of_the_same_load():
    """nvidia-smi -q -x, captured during the same matrix-product loop, says the same."""
    gpu = ET.fromstring(fixture("nvidia-smi-q.xml")).find("gpu")  # noqa: S314 - the repo's own capture
    assert gpu.findtext("mig_mode/current_mig") == "Disabled"
    [reading] = parse_query_gpu(fixture("query-gpu-busy.csv"))
    assert gpu.findtext("uuid") == reading.uuid
    assert gpu.findtext("utilization/gpu_util") == f"{reading.utilization_pct:.0f} %"
    assert gpu.findtext("fb_memory_usage/used") == f"{reading.memory_used_mib:.0f} MiB"
    # Read a moment apart during the same load: within a degree.
    assert abs(float(gpu.findtext("temperature/gpu_temp").split()[0]) - reading.temperature_c) <= 1
    assert gpu.findtext("processes/process_info/pid") == "415"


def test_the_uuid_is_the_one_nvidia_smi_L_lists():
    assert parse_nvidia_smi_list(fixture("nvidia-smi-L.txt")) == [(0, H200_UUID)]


def test_compute_apps_of_the_busy_h200():
    [app] = parse_compute_apps(fixture("query-compute-apps-busy.csv"))
    assert (app.pid, app.gpu_uuid, app.used_memory_mib, app.process_name) == (
        415,
        H200_UUID,
        1002.0,
        "python3",
    )


def test_compute_apps_keeps_a_comma_in_a_process_name_and_reads_nothing_from_an_idle_gpu():
    [app] = parse_compute_apps(f"77, {H200_UUID}, 512, python3 train.py --a=1,2\n")
    assert app.process_name == "python3 train.py --a=1,2"
    assert parse_compute_apps("") == []


def test_no_value_markers_read_as_none():
    # The H200 row with the markers nvidia-smi writes for a GPU in MIG mode or a missing counter.
    line = f"1, {H200_UUID}, NVIDIA H200, 143771, [Not Supported], [N/A], [N/A], 40, [N/A], 1980, Enabled\n"
    [gpu] = parse_query_gpu(fixture("query-gpu-idle.csv") + line)[1:]
    assert (gpu.index, gpu.utilization_pct, gpu.memory_used_mib, gpu.memory_total_mib) == (
        1,
        None,
        None,
        143771.0,
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0, GPU-x, NVIDIA H200, 143771, 0, 0\n", "6 columns, expected 11"),
        (
            "0, GPU-x, NVIDIA H200, 143771, 0, busy, 0, 40, 126.52, 1980, Enabled\n",
            "utilization.gpu is not a number",
        ),
        ("x, GPU-x, NVIDIA H200, 143771, 0, 0, 0, 40, 126.52, 1980, Enabled\n", "GPU index 'x'"),
        ("0, GPU-x, NVIDIA H200, 143771, 0, nan, 0, 40, 126.52, 1980, Enabled\n", "not finite"),
        ("No devices were found\n", "1 columns"),
    ],
)
def test_malformed_query_gpu_output_names_the_line(text, message):
    with pytest.raises(GpuMetricsError, match=message) as raised:
        parse_query_gpu(fixture("query-gpu-idle.csv") + text)
    assert "line 2" in str(raised.value)


def test_malformed_compute_apps():
    with pytest.raises(GpuMetricsError, match="pid 'abc'"):
        parse_compute_apps(f"abc, {H200_UUID}, 1002, python3\n")


def test_samples_by_index_maps_a_jobs_gpus_to_their_readings():
    readings = parse_query_gpu(fixture("query-gpu-busy.csv"))
    samples = samples_by_index({"local-1": [0], "local-2": [1], "local-3": []}, readings)
    # GPU 1 is not on this one-GPU machine: that job is unknown, not idle.
    assert samples == {
        "local-1": GpuSample(
            "local-1", gpus=1, min_pct=100.0, max_pct=100.0, mean_pct=100.0, memory_used_mib=1011.0,
            memory_total_mib=143771.0, temperature_c=65.0, power_w=692.1, xid=None,
        )
    }  # fmt: skip


def test_a_jobs_sample_spans_and_sums_its_gpus_and_leaves_out_a_figure_one_gpu_lacks():
    readings = [
        GpuReading(0, "GPU-a", "NVIDIA H200", 90.0, 1000.0, 143771.0, temperature_c=60.0, power_w=500.0),
        GpuReading(1, "GPU-b", "NVIDIA H200", 30.0, 3000.0, 143771.0, temperature_c=71.0, power_w=None),
    ]
    sample = samples_by_index({"local-9": [0, 1]}, readings)["local-9"]
    assert (sample.gpus, sample.min_pct, sample.max_pct, sample.mean_pct) == (2, 30.0, 90.0, 60.0)
    assert (sample.memory_used_mib, sample.memory_total_mib) == (4000.0, 287542.0)
    assert sample.temperature_c == 71.0  # the hottest
    assert sample.power_w is None  # not a sum over only some of the GPUs


def test_samples_by_index_leaves_out_a_job_with_a_gpu_without_a_value():
    readings = [
        *parse_query_gpu(fixture("query-gpu-idle.csv")),
        GpuReading(1, "GPU-b", "NVIDIA H200", None, None, None),
    ]
    assert samples_by_index({"local-1": [0, 1]}, readings) == {}
    assert samples_by_index({"local-1": [0]}, readings)["local-1"].max_pct == 0.0


# --- Prometheus text, as dcgm-exporter writes it

NODE = 'gpu="{gpu}",UUID="GPU-{gpu}a0c1d2e-4cc4-0a16-d75d-86bb37ecacb3",pci_bus_id="00000000:0{gpu}:00.0",device="nvidia{gpu}",modelName="NVIDIA H200",Hostname="gpu-node-07",DCGM_FI_DRIVER_VERSION="580.159.04"'
EXPOSITION = f"""\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{{NODE.format(gpu=0)},hpc_job="4242"}} 0
DCGM_FI_DEV_GPU_UTIL{{{NODE.format(gpu=1)},hpc_job="4242"}} 3
DCGM_FI_DEV_GPU_UTIL{{{NODE.format(gpu=2)},hpc_job="4243"}} 97 1764400000000
DCGM_FI_DEV_GPU_UTIL{{{NODE.format(gpu=3)}}} 0
# HELP DCGM_FI_DEV_MEMORY_TEMP Memory temperature (in C).
# TYPE DCGM_FI_DEV_MEMORY_TEMP gauge
DCGM_FI_DEV_MEMORY_TEMP{{{NODE.format(gpu=0)},hpc_job="4242"}} 9223372036854775794
DCGM_FI_DEV_FB_USED{{{NODE.format(gpu=0)},hpc_job="4242"}} 1011
"""


def test_prometheus_text_reads_names_labels_values():
    series = parse_prometheus_text(EXPOSITION)
    assert [s.name for s in series] == ["DCGM_FI_DEV_GPU_UTIL"] * 4 + [
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_FB_USED",
    ]
    first = series[0]
    assert first.labels["UUID"] == "GPU-0a0c1d2e-4cc4-0a16-d75d-86bb37ecacb3"
    assert (first.labels["Hostname"], first.labels["hpc_job"], first.value) == ("gpu-node-07", "4242", 0.0)
    assert series[2].value == 97.0  # the timestamp is not the value
    assert "hpc_job" not in series[3].labels
    assert series[4].value == 9223372036854775794.0
    assert len(parse_prometheus_text(EXPOSITION, names=["DCGM_FI_DEV_GPU_UTIL"])) == 4


def test_prometheus_text_escapes_special_values_and_spacing():
    text = 'm{a="say \\"hi\\"",b="back\\\\slash",c="two\\nlines", } NaN\nm{} +Inf\nm -1.5e3\nm\t2\n'
    series = parse_prometheus_text(text)
    assert series[0].labels == {"a": 'say "hi"', "b": "back\\slash", "c": "two\nlines"}
    assert math.isnan(series[0].value)
    assert [s.value for s in series[1:]] == [math.inf, -1500.0, 2.0]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        # What prometheus_client's parser says; the line number is ours.
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0"}', "could not convert string to float: ''"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} high', "could not convert string to float: 'high'"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0} 1', "could not convert"),
        ("DCGM_FI_DEV_GPU_UTIL{gpu=0} 1", "Invalid labels"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 1 yesterday', "'yesterday'"),
        ("DCGM_FI_DEV_GPU_UTIL 1_000", "Invalid value"),
        ("<html><body>502 Bad Gateway</body></html>", "invalid metric name"),
    ],
)
def test_a_malformed_line_makes_the_answer_unreadable_with_its_line_number(line, message):
    with pytest.raises(GpuMetricsError, match=re.escape(message)) as raised:
        parse_prometheus_text(EXPOSITION + line + "\n")
    assert "metrics line 11" in str(raised.value)


def test_dcgm_slurm_jobs_by_hpc_job_label():
    samples = dcgm_job_samples(parse_prometheus_text(EXPOSITION), ["4242", "4243", "9999"])
    assert samples == {
        # 4242's FB_USED without FB_FREE: no memory figure rather than a wrong one.
        "4242": GpuSample("4242", gpus=2, min_pct=0.0, max_pct=3.0, mean_pct=1.5),
        "4243": GpuSample("4243", gpus=1, min_pct=97.0, max_pct=97.0, mean_pct=97.0),
    }  # 9999 is not on this exporter: left out; the GPU without hpc_job belongs to no job


def test_dcgm_kubernetes_jobs_by_namespace_and_pod():
    job = "pj-0123456789abcdef0123456789abcdef"
    text = f"""\
DCGM_FI_DEV_GPU_UTIL{{{NODE.format(gpu=0)},container="main",namespace="protein-lab",pod="{job}-x7k2q"}} 2
DCGM_FI_DEV_GPU_UTIL{{{NODE.format(gpu=1)},container="main",namespace="protein-lab",pod="{job}-x7k2q"}} 4
DCGM_FI_DEV_GPU_UTIL{{{NODE.format(gpu=2)},container="main",namespace="other-team",pod="{job}-abcde"}} 0
DCGM_FI_DEV_GPU_UTIL{{{NODE.format(gpu=3)},exported_container="main",exported_namespace="md-team",exported_pod="pj-md-1-q2w3e",namespace="gpu-operator",pod="nvidia-dcgm-exporter-8xk2p"}} 55
"""
    wanted = [f"protein-lab/{job}", "md-team/pj-md", "other-team/pj-else"]
    samples = dcgm_job_samples(parse_prometheus_text(text), wanted)
    assert samples == {
        f"protein-lab/{job}": GpuSample(f"protein-lab/{job}", gpus=2, min_pct=2.0, max_pct=4.0, mean_pct=3.0),
        # Read through a Prometheus that renamed the pod's labels; an indexed Job's pod.
        "md-team/pj-md": GpuSample("md-team/pj-md", gpus=1, min_pct=55.0, max_pct=55.0, mean_pct=55.0),
    }


def test_dcgm_mig_instances_blank_values_and_a_repeated_device():
    mig = 'gpu="0",UUID="GPU-75bdf912-4cc4-0a16-d75d-86bb37ecacb3",device="nvidia0",modelName="NVIDIA H200",Hostname="n1",hpc_job="77"'
    text = f"""\
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{mig},GPU_I_PROFILE="1g.18gb",GPU_I_ID="9"}} 0.020000
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{mig},GPU_I_PROFILE="1g.18gb",GPU_I_ID="10"}} 0.000000
DCGM_FI_DEV_GPU_UTIL{{{NODE.format(gpu=1)},hpc_job="78"}} 9223372036854775794
DCGM_FI_DEV_GPU_UTIL{{{NODE.format(gpu=2)},hpc_job="79"}} 40
DCGM_FI_DEV_GPU_UTIL{{{NODE.format(gpu=2)},hpc_job="79"}} 40
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{NODE.format(gpu=2)},hpc_job="79"}} 0.9
"""
    samples = dcgm_job_samples(parse_prometheus_text(text), ["77", "78", "79"])
    assert samples["77"] == GpuSample("77", gpus=2, min_pct=0.0, max_pct=2.0, mean_pct=1.0)
    assert "78" not in samples  # DCGM's blank value: no reading, so no sample
    assert samples["79"] == GpuSample(
        "79", gpus=1, min_pct=40.0, max_pct=40.0, mean_pct=40.0
    )  # GPU_UTIL wins


def test_dcgm_every_field_of_an_h200_job_from_the_capture():
    """The busy H200 capture as dcgm-exporter would serve it, for a two-GPU Slurm job."""
    [busy] = parse_query_gpu(fixture("query-gpu-busy.csv"))
    free = busy.memory_total_mib - busy.memory_used_mib
    lines = []
    for gpu, xid in ((0, 0), (1, 79)):
        labels = f'{NODE.format(gpu=gpu)},hpc_job="4300"'
        lines += [
            f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {busy.utilization_pct - gpu * 40}",
            f"DCGM_FI_DEV_FB_USED{{{labels}}} {busy.memory_used_mib}",
            f"DCGM_FI_DEV_FB_FREE{{{labels}}} {free}",
            f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} {busy.temperature_c + gpu}",
            f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} {busy.power_w}",
            f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} {xid}",
            f"DCGM_FI_DEV_MEMORY_TEMP{{{labels}}} 9223372036854775794",  # not read
        ]
    [sample] = dcgm_job_samples(parse_prometheus_text("\n".join(lines) + "\n"), ["4300"]).values()
    assert (sample.gpus, sample.min_pct, sample.max_pct, sample.mean_pct) == (2, 60.0, 100.0, 80.0)
    assert (sample.memory_used_mib, sample.memory_total_mib) == (2022.0, 287542.0)
    assert (sample.temperature_c, sample.power_w, sample.xid) == (66.0, 1384.2, 79)


def test_dcgm_blank_sentinels_of_a_field_leave_that_figure_out():
    labels = f'{NODE.format(gpu=0)},hpc_job="4301"'
    text = f"""\
DCGM_FI_DEV_GPU_UTIL{{{labels}}} 12
DCGM_FI_DEV_GPU_TEMP{{{labels}}} 9223372036854775794
DCGM_FI_DEV_POWER_USAGE{{{labels}}} NaN
DCGM_FI_DEV_FB_USED{{{labels}}} 100
DCGM_FI_DEV_FB_FREE{{{labels}}} -1
"""
    [sample] = dcgm_job_samples(parse_prometheus_text(text), ["4301"]).values()
    assert sample.mean_pct == 12.0
    assert (sample.temperature_c, sample.power_w, sample.memory_total_mib) == (None, None, None)


@pytest.mark.parametrize(
    ("slug", "expected"),
    [("testbed", 'cluster="testbed"'), ('we"ird\\', 'cluster="we\\"ird\\\\"')],
)
def test_the_promql_selects_every_dcgm_field_of_one_cluster(slug, expected):
    fields, xids = dcgm_promql(slug)
    assert fields.endswith(f"{expected}}}") and xids.count(expected) == 2  # the XID and its changes
    assert all(name in fields + xids for name in DCGM_METRICS)


def test_fetch_refuses_other_schemes_and_reports_an_unreachable_url():
    with pytest.raises(GpuMetricsError, match="not http"):
        fetch_metrics(f"file://{FIXTURES}/README.md")
    with pytest.raises(GpuMetricsError, match=re.escape("127.0.0.1:9")):
        fetch_metrics("http://127.0.0.1:9/metrics", timeout_s=2)  # the discard port: nothing listens


def test_a_metrics_url_with_credentials_never_shows_them():
    from clusters.gpu_metrics import GpuMetricsError, fetch_metrics

    with pytest.raises(GpuMetricsError) as refused:
        fetch_metrics("http://scraper:s3cret@127.0.0.1:9/metrics", timeout_s=2)
    assert "s3cret" not in str(refused.value) and "127.0.0.1:9/metrics" in str(refused.value)
    with pytest.raises(GpuMetricsError) as refused:
        fetch_metrics("ftp://scraper:s3cret@127.0.0.1/metrics")
    assert "s3cret" not in str(refused.value)


# --- NVML (the local cluster's first source; tests/jobs/test_idle_gpus.py reads nvidia-smi where
# NVML cannot start, as on this machine, and the real H200 run is in docs/monitoring-h200.md)


def test_nvml_figures_read_in_nvidia_smis_units_from_the_pynvml_capture():
    # pynvml-busy.txt: "util <gpu %> <memory %> mem <used bytes> <total bytes> temp <°C> name <name>"
    words = fixture("pynvml-busy.txt").split()
    reading = nvml_reading(
        0,
        uuid=H200_UUID.encode(),  # older pynvml answers bytes
        name=" ".join(words[9:11]),
        utilization_pct=int(words[1]),
        memory_used_bytes=int(words[4]),
        memory_total_bytes=int(words[5]),
        temperature_c=int(words[7]),
        power_mw=692100,
    )
    [smi] = parse_query_gpu(fixture("query-gpu-busy.csv"))
    assert (reading.uuid, reading.name) == (smi.uuid, smi.name)
    assert reading.memory_total_mib == smi.memory_total_mib == 143771.0  # the same card, in MiB
    assert (reading.utilization_pct, reading.memory_used_mib, reading.temperature_c) == (100.0, 1625.9, 63.0)
    assert reading.power_w == 692.1


# --- The portal's own run on a real H200 (tests/fixtures/h200-run/)


def test_nvidia_smis_query_during_the_h200_training_run_agrees_with_the_portals_nvml_readings():
    run = json.loads((ROOT / "tests" / "fixtures" / "h200-run" / "h200-run.json").read_text())
    [smi] = parse_query_gpu(run["query_gpu_training"])
    assert (smi.name, smi.memory_total_mib, smi.utilization_pct) == ("NVIDIA H200", 143771.0, 100.0)
    training = [s for s in run["portal"]["train"]["gpu_samples"] if s["utilization_pct"] == 100]
    assert len(training) >= 5
    # What the portal kept through NVML while the job trained, and nvidia-smi's own figures.
    assert {s["memory_total_mib"] for s in training} == {smi.memory_total_mib}
    assert all(
        abs(s["memory_used_mib"] - smi.memory_used_mib) < 0.01 * smi.memory_total_mib for s in training
    )
    assert all(abs(s["temperature_c"] - smi.temperature_c) <= 5 for s in training)
    assert all(0.85 < s["power_w"] / smi.power_w < 1.2 for s in training)
    assert {s["memory_used_pct"] for s in training} == {93.0}
