"""GPU/driver check. The driver is the one thing not on the CI machine: it is fed through named
test doubles (a /proc/driver/nvidia/version file written here, a GpuInfo built here)."""

from pathlib import Path

import pytest

from rftstack.doctor.checks import gpu
from rftstack.findings import FAIL, OK

# Test double: the text /proc/driver/nvidia/version has on the report's server (driver 570.133.20).
PROC_570 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  Fri Mar 14 04:23:21 UTC 2025\n"
    "GCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04)\n"
)
PROC_580_OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16-I3-B03-4-3)\n"


@pytest.mark.parametrize("driver,cuda", [
    ("570.133.20", (12, 8)), ("570.195.03", (12, 8)), ("575.51.03", (12, 9)), ("580.65.06", (13, 0)),
    ("590.44.01", (13, 0)), ("535.247.01", (12, 2)), ("572.16", (12, 8)), ("470.256.02", None),
])
def test_driver_table(driver, cuda):
    assert gpu.max_cuda_for_driver(driver) == cuda


def test_min_driver_for_cuda():
    assert gpu.min_driver_for_cuda((13, 0)) == 580
    assert gpu.min_driver_for_cuda((12, 8)) == 570
    assert gpu.min_driver_for_cuda((12, 0)) == 525
    assert gpu.min_driver_for_cuda((14, 0)) is None


def test_driver_branch_rejects_garbage():
    with pytest.raises(ValueError):
        gpu.driver_branch("unknown")


@pytest.mark.parametrize("text,version", [(PROC_570, "570.133.20"), (PROC_580_OPEN, "580.65.06"), ("nothing here", None)])
def test_parse_proc_version(text, version):
    assert gpu.parse_proc_version(text) == version


def test_read_proc_from_alternative_file(tmp_path):
    f = tmp_path / "version"
    f.write_text(PROC_570)
    info = gpu.read_proc(f)
    assert info.driver_version == "570.133.20" and info.max_cuda == (12, 8) and info.cuda is None


def test_nvml_reported_cuda_wins_over_table():
    assert gpu.GpuInfo("570.133.20", cuda=(12, 8)).max_cuda == (12, 8)
    assert gpu.GpuInfo("580.65.06", cuda=(13, 0)).max_cuda == (13, 0)


def test_parse_smi_csv():
    driver, gpus = gpu.parse_smi_csv("570.133.20, NVIDIA RTX 5880 Ada Generation, 8.9, 49140, 48500\n")
    assert driver == "570.133.20"
    assert gpus == (gpu.Gpu("NVIDIA RTX 5880 Ada Generation", (8, 9), 49140, 48500),)


@pytest.mark.skipif(Path("/proc/driver/nvidia/version").exists(), reason="this machine has an NVIDIA driver")
def test_no_gpu_is_a_finding_not_a_crash():
    info = gpu.read()  # the real readers, on a machine without a driver
    assert info.driver_version is None and info.notes
    [f] = gpu.check(info)
    assert f.status == FAIL and "No NVIDIA driver" in f.message and f.fix


def test_check_reports_driver_and_gpu():
    info = gpu.GpuInfo("570.133.20", None, (gpu.Gpu("NVIDIA RTX 5880 Ada Generation", (8, 9), 49140, 48500),), "test double")
    found = {f.check: f for f in gpu.check(info)}
    assert found["gpu.driver"].status == OK and "12.8" in found["gpu.driver"].message
    assert found["gpu.0"].status == OK and "49140 MiB" in found["gpu.0"].message and "8.9" in found["gpu.0"].message


def test_proc_only_driver_without_gpus_warns():
    found = gpu.check(gpu.GpuInfo("570.133.20", None, (), "/proc/driver/nvidia/version"))
    assert [f.status for f in found] == [OK, "warn"]
