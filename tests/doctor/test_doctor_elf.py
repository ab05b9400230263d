"""ELF check on real shared objects: built with gcc here, and the real installed torch/vllm."""

import shutil
import subprocess

import importlib.metadata as md
import pytest

from rftstack.stack import policy
from rftstack.doctor.checks import elf
from rftstack.findings import FAIL, INFO, OK

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def _so(out, soname, src="int f(void){return 1;}", links=()):
    c = out.with_suffix(".c")
    c.write_text(src)
    cmd = ["gcc", "-shared", "-fPIC", "-o", str(out), str(c), f"-Wl,-soname,{soname}"]
    for lib_dir, name in links:
        cmd += [f"-L{lib_dir}", f"-l:{name}"]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def fake_site(tmp_path_factory):
    """A site dir with two distributions whose extensions link a libcudart built here:
    cu13pkg 1.0 -> libcudart.so.13, cu12pkg 1.0 -> libcudart.so.12."""
    site = tmp_path_factory.mktemp("site")
    for major in (12, 13):
        pkg = site / f"cu{major}pkg"
        pkg.mkdir()
        _so(pkg / f"libcudart.so.{major}", f"libcudart.so.{major}", "int cudaRuntimeGetVersion(int*v){*v=1;return 0;}")
        _so(pkg / "_C.so", f"_C{major}.so", "int cudaRuntimeGetVersion(int*);int g(void){int v;return cudaRuntimeGetVersion(&v);}",
            links=[(pkg, f"libcudart.so.{major}")])
        di = site / f"cu{major}pkg-1.0.dist-info"
        di.mkdir()
        (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nvidia-cu{major}pkg\nVersion: 1.0\n")
        (di / "RECORD").write_text(f"cu{major}pkg/_C.so,,\ncu{major}pkg/libcudart.so.{major},,\ncu{major}pkg/_C.c,,\n")
    return site


def test_read_links_of_gcc_built_objects(fake_site):
    lib = elf.read_links(fake_site / "cu13pkg" / "libcudart.so.13")
    assert lib.soname == "libcudart.so.13" and lib.cuda_major == 13
    user = elf.read_links(fake_site / "cu13pkg" / "_C.so")
    assert "libcudart.so.13" in user.needed and user.cuda_major == 13
    assert elf.read_links(fake_site / "cu12pkg" / "_C.so").cuda_major == 12
    assert elf.read_links(fake_site / "cu12pkg" / "_C.c") is None  # not ELF


@pytest.mark.parametrize("names,major", [
    (["libcudart.so.13", "libc.so.6"], 13), (["libcublas.so.12", "libcuda.so.1"], 12),
    (["libcufft.so.12"], None),  # cuFFT 12 ships with CUDA 13: not a CUDA major
    (["libcuda.so.1"], None), ([], None),
])
def test_cuda_major_of(names, major):
    assert elf.cuda_major_of(names) == major


def test_fake_dists_against_570_and_580(fake_site):
    found = elf.scan(md.distributions(path=[str(fake_site)]))
    assert {(d.dist, d.cuda_major) for d in found} == {("nvidia-cu12pkg", 12), ("nvidia-cu13pkg", 13)}
    [f570] = elf.check(found, (12, 8), "570.133.20")
    assert f570.status == FAIL and "nvidia-cu13pkg" in f570.message and f570.fix.index("rftstack flavour cuda12") < f570.fix.index("nix run .#serve")
    [f580] = elf.check(found, (13, 0), "580.65.06")
    assert f580.status == OK
    only12 = [d for d in found if d.cuda_major == 12]
    assert elf.check(only12, (12, 8), "570.133.20")[0].status == OK


def test_real_installed_stack_fails_on_570_and_passes_on_580():
    """The installed torch/vllm are the CUDA 13 PyPI builds: the report's problem 3 on driver 570."""
    found = elf.scan()
    by = {d.dist: d for d in found}
    assert by["torch"].cuda_major == 13 and by["vllm"].cuda_major == 13
    pol = policy.load()
    res = {f.check: f for f in elf.check(found, (12, 8), "570.133.20", pol)}
    for name in ("torch", "vllm"):
        f = res[f"elf.{name}"]
        assert f.status == FAIL and "libcudart.so.13" in f.message and "570.133.20" in f.message
        assert f.fix.index("rftstack flavour cuda12") < f.fix.index("nix run .#serve") and "+cu12" in f.fix  # names the CUDA 12 build from policy.toml
    assert res["elf.nvidia"].status == FAIL
    res580 = elf.check(found, (13, 0), "580.65.06", pol)
    assert all(f.status == OK for f in res580), [f for f in res580 if f.status != OK]
    assert all(f.status == INFO for f in elf.check(found, None, None, pol))
