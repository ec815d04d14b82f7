"""The catalog's MIG profiles against what a real H200 says of itself: `nvidia-smi mig -lgip`,
captured on the lent H200 (tests/fixtures/accelerators/README.md)."""

import re
from pathlib import Path

import pytest

from clusters.models import GpuModel
from clusters.shares import mig_profiles

pytestmark = pytest.mark.django_db

CAPTURE = (
    Path(__file__).resolve().parent.parent / "fixtures" / "accelerators" / "nvidia-smi-mig-lgip-h200.txt"
)
# "|   0  MIG 3g.71gb          9     2/2        69.75      No     60     3     0   |"
ROW = re.compile(r"^\|\s+\d+\s+MIG (\S+)\s+\d+\s+\d+/(\d+)\s+([\d.]+)\s+\w+\s+(\d+)\s")


def real_profiles() -> dict[str, tuple[int, float, int]]:
    """Profile name → (instances per device, memory GiB, SMs), as the H200 reported them."""
    rows = (ROW.match(line) for line in CAPTURE.read_text().splitlines())
    return {m[1]: (int(m[2]), float(m[3]), int(m[4])) for m in rows if m}


def test_the_capture_holds_the_h200s_profiles():
    profiles = real_profiles()
    assert len(profiles) == 7 and profiles["7g.141gb"] == (1, 140.0, 132)


def test_the_catalogs_h200_profiles_are_the_ones_the_device_reports(catalog):
    real = real_profiles()
    catalog_profiles = mig_profiles(GpuModel.objects.get(slug="h200").mig_profiles)
    assert {p.name for p in catalog_profiles} == set(real) - {"1g.18gb+me"}
    for profile in catalog_profiles:
        instances, memory_gib, sms = real[profile.name]
        assert profile.instances_max == instances, profile.name
        # an instance is never charged less than the part of the device it holds: its SMs of the
        # 7g's 132, its memory of the 7g's 140 GiB (to the 4 places the fraction is rounded to)
        held = max(sms / 132, memory_gib / 140.0)
        assert float(profile.fraction) >= held - 0.0001, (profile.name, profile.fraction, held)
    by_memory = sorted(catalog_profiles, key=lambda p: (real[p.name][1], p.compute_slices))
    assert [p.name for p in by_memory] == [p.name for p in catalog_profiles]
