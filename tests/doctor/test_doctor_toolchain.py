"""JIT toolchain check with the real tools on this machine: triton's bundled ptxas (CUDA 12.8) and
the CUDA 13.0 toolkit under /usr/local/cuda-13.0; the driver's CUDA is given as a number."""

import os
import shutil
from pathlib import Path

import pytest

from rftstack.doctor.checks import toolchain
from rftstack.findings import FAIL, INFO, OK, WARN

CUDA13 = Path("/usr/local/cuda-13.0")
needs_cuda13 = pytest.mark.skipif(not (CUDA13 / "bin" / "nvcc").exists(), reason="needs the CUDA 13.0 toolkit at /usr/local/cuda-13.0")


def test_parse_release():
    assert toolchain.parse_release("Cuda compilation tools, release 12.8, V12.8.93") == (12, 8)
    assert toolchain.parse_release("garbage") is None


def test_bundled_ptxas_is_found_like_triton_does():
    tool = toolchain.find_ptxas({})
    assert tool.path.endswith("triton/backends/nvidia/bin/ptxas") and tool.chosen_by == "triton's bundled ptxas"
    assert tool.version == (12, 8)  # triton 3.6's bundled ptxas
    [f, _] = toolchain.check(tool, toolchain.Tool("nvcc", None, "x", None), (12, 8), {"VLLM_USE_FLASHINFER_SAMPLER": "0"})
    assert f.status == OK


@needs_cuda13
def test_ptxas_newer_than_driver_fails_naming_the_variable():
    env = {"TRITON_PTXAS_PATH": str(CUDA13 / "bin" / "ptxas")}
    tool = toolchain.find_ptxas(env)
    assert tool.version == (13, 0) and tool.chosen_by == "$TRITON_PTXAS_PATH"
    f = toolchain.check(tool, toolchain.find_nvcc(env), (12, 8), env)[0]
    assert f.status == FAIL and "TRITON_PTXAS_PATH" in f.fix and "unsupported toolchain" in f.message
    assert toolchain.check(tool, toolchain.find_nvcc(env), (13, 0), env)[0].status == OK


def test_unrunnable_triton_ptxas_path_falls_back_to_bundled(tmp_path):
    tool = toolchain.find_ptxas({"TRITON_PTXAS_PATH": str(tmp_path / "missing")})
    assert tool.version == (12, 8) and "falls back" in tool.chosen_by


@needs_cuda13
def test_nvcc_from_cuda_home_newer_than_driver_fails():
    env = {"CUDA_HOME": str(CUDA13)}
    nvcc = toolchain.find_nvcc(env)
    assert nvcc.version == (13, 0) and nvcc.chosen_by == "$CUDA_HOME"
    f = toolchain.check(toolchain.find_ptxas(env), nvcc, (12, 8), env)[1]
    assert f.status == FAIL and "CUDA_HOME" in f.fix and "VLLM_USE_FLASHINFER_SAMPLER=0" in f.fix
    off = toolchain.check(toolchain.find_ptxas(env), nvcc, (12, 8), {**env, "VLLM_USE_FLASHINFER_SAMPLER": "0"})[1]
    assert off.status == WARN


def test_no_nvcc_suggests_sampler_off(tmp_path):
    env = {"CUDA_HOME": str(tmp_path)}  # a CUDA_HOME without bin/nvcc
    nvcc = toolchain.find_nvcc(env)
    assert nvcc.path is None
    f = toolchain.check(toolchain.find_ptxas(env), nvcc, (12, 8), env)[1]
    assert f.status == WARN and "VLLM_USE_FLASHINFER_SAMPLER=0" in f.fix
    f = toolchain.check(toolchain.find_ptxas(env), nvcc, (12, 8), {**env, "VLLM_USE_FLASHINFER_SAMPLER": "0"})[1]
    assert f.status == OK


def test_nvcc_found_on_path_like_flashinfer(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc on PATH")
    nvcc = toolchain.find_nvcc({"PATH": os.environ["PATH"]})
    assert nvcc.chosen_by == "nvcc on PATH" and nvcc.version is not None
    assert toolchain.check(toolchain.find_ptxas({}), nvcc, None, {})[1].status == INFO
