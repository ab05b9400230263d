"""Re-capture the doctor output quoted in docs/problems.md (run from the repo root with the stack's
Python: `PYTHONPATH=python .venv/bin/python docs/capture_problems.py`). Takes ~40 s.

Real inputs throughout; the one test double is the driver (`report_server`: what NVML reports on the
report's server, 570.133.20 with an RTX 5880 Ada), as in tests/doctor/test_doctor.py.
"""

import os
import re
import shutil
import tempfile
from pathlib import Path

from rftstack.doctor.collect import collect as doctor
from rftstack.stack import policy
from rftstack.run import report_config
from rftstack.run import tinymodel
from rftstack.doctor.collect.checks import gpu, pyenv, vllm_api
from rftstack.findings import render


def report_server():
    """Test double for NVML on the report's server."""
    return gpu.GpuInfo("570.133.20", (12, 8), (gpu.Gpu("NVIDIA RTX 5880 Ada Generation", (8, 9), 49140, 48610),), "test double: report server (NVML)")


def show(title, findings, keep):
    print(f"### {title}\n```")
    print(render([f for f in findings if any(f.check.startswith(k) for k in keep)]))
    print("```\n")


with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    # problems 1/2: the verl metadata as published (numpy<2.0.0) next to numpy 2, unrelaxed
    site = tmp / "site"
    site.mkdir()
    for name, ver, reqs in (("verl", "0.8.0", ["numpy<2.0.0"]), ("numpy", "2.3.5", []),
                            ("opencv-python-headless", "5.0.0.93", ['numpy>=2; python_version >= "3.9"'])):
        di = site / f"{name.replace('-', '_')}-{ver}.dist-info"
        di.mkdir()
        (di / "METADATA").write_text("\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {ver}"] + [f"Requires-Dist: {r}" for r in reqs]) + "\n")
    show("1/2 unrelaxed verl metadata (dist-info as published)", pyenv.check(pyenv.installed([str(site)]), policy.load()), ["pyenv"])
    # problems 4/5: a copy of the installed vllm's sources set back to 0.19.1's shape
    src = vllm_api.package_dir("vllm")
    old = tmp / "old" / "vllm"
    shutil.copytree(src, old, ignore=lambda d, names: [n for n in names if not (n.endswith(".py") or os.path.isdir(os.path.join(d, n)))])
    pt = old / "distributed" / "weight_transfer" / "packed_tensor.py"
    pt.write_text(pt.read_text().replace("def pack_tensors(", "def _gone_in_0191("))
    wt = old / "config" / "weight_transfer.py"
    wt.write_text(re.sub(r"backend: .*= \"nccl\"", 'backend: Literal["nccl", "ipc"] = "nccl"', wt.read_text()))
    show("4/5 vllm 0.19.1-shaped sources", vllm_api.check(vllm_api.package_dir("trinity"), old, "0.19.1"), ["vllm-api"])
    # the report's config, on the report's server (driver double), with the real installed stack
    model = tinymodel.ensure(tmp / "tiny")
    cfg = tmp / "report.yaml"
    report_config.write(cfg, model, project=None, name=None, checkpoint_root_dir=tmp / "ckpt")
    found = doctor.collect(str(cfg), gpu_reader=report_server, env={**os.environ, "RAY_TMPDIR": str(tmp)})
    show("report config, driver 570 (test double), installed stack", found, [""])
    report_config.write(cfg, model, max_model_len=2048, project=None, name=None, checkpoint_root_dir=tmp / "ckpt")
    found = doctor.collect(str(cfg), gpu_reader=report_server, env={**os.environ, "RAY_TMPDIR": str(tmp)}, skip={"elf", "toolchain", "pyenv", "vllm-api", "network", "ray"})
    show("report config + max_model_len", found, ["config"])
