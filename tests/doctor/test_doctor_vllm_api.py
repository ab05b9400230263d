"""vLLM APIs Trinity needs, read with ast from the real installed trinity and vllm, and from a copy
of vllm's sources changed back to vllm 0.19.1's shape (the report's problems 4 and 5)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import rftstack

from rftstack.doctor.checks import vllm_api
from rftstack.findings import FAIL, OK

TRINITY = vllm_api.package_dir("trinity")
VLLM = vllm_api.package_dir("vllm")


def test_installed_vllm_has_everything_trinity_needs():
    found = {f.check: f for f in vllm_api.check(TRINITY, VLLM, "0.23.0")}
    assert all(f.status == OK for f in found.values()), found
    assert "update_weights" in found["vllm-api.async_llm"].data["calls"]
    assert "init_weight_transfer_engine" in found["vllm-api.async_llm"].data["calls"]


def test_reading_does_not_import_vllm():
    code = ("import sys; from rftstack.doctor.checks import vllm_api as v; "
            "v.check(v.package_dir('trinity'), v.package_dir('vllm')); "
            "print(sorted(m for m in ('vllm','torch','trinity','ray') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(Path(rftstack.__file__).parent.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == "[]"


@pytest.fixture(scope="module")
def vllm_0191(tmp_path_factory):
    """The installed vllm's .py files, with packed_tensor.py and weight_transfer.py set back to what
    vllm 0.19.1 has: no pack_tensors, backend: Literal["nccl", "ipc"]."""
    root = tmp_path_factory.mktemp("old") / "vllm"
    shutil.copytree(VLLM, root, ignore=lambda d, names: [n for n in names if not (n.endswith(".py") or os.path.isdir(os.path.join(d, n)))])
    pt = root / "distributed" / "weight_transfer" / "packed_tensor.py"
    pt.write_text(pt.read_text().replace("def pack_tensors(", "def _gone_in_0191("))
    wt = root / "config" / "weight_transfer.py"
    text, n = re.subn(r"backend: .*= \"nccl\"", 'backend: Literal["nccl", "ipc"] = "nccl"', wt.read_text())
    assert n == 1
    wt.write_text(text)
    return root


def test_vllm_0191_shape_fails_with_both_report_errors(vllm_0191):
    found = {f.check: f for f in vllm_api.check(TRINITY, vllm_0191, "0.19.1")}
    imp = found["vllm-api.imports"]
    assert imp.status == FAIL and "pack_tensors" in imp.message and "vllm_extension.py" in imp.message
    assert "0.22" in imp.fix
    be = found["vllm-api.weight_transfer_backend"]
    assert be.status == FAIL and "Literal['nccl', 'ipc']" in be.message and "'nccl' or 'ipc'" in be.message


@pytest.mark.parametrize("src,ok", [
    ('Literal["nccl", "ipc"]', False), ('Literal["nccl", "ipc"] | str', True), ("str", True),
    ('Literal["nccl", "ipc", "checkpoint"]', True), ("Optional[str]", True),
])
def test_backend_accepts(src, ok):
    import ast
    assert vllm_api.backend_accepts(ast.parse(src, mode="eval").body, "checkpoint") is ok
