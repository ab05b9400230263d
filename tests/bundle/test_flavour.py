"""`rftstack flavour cuda12` against a local HTTP server, in a throwaway venv (never the project's).

The CUDA 12 builds of policy.toml (torch 2.11.0+cu128, vllm 0.23.0+cu129, ...) cannot be
downloaded from our machines, so the server serves STAND-IN wheels, built here: real wheel zips
(METADATA, WHEEL, RECORD) with the real distribution names, versions and file names (the Python
tag is this interpreter's where the real one is cp312 and this is not 3.12), whose shared objects
are real ELF files built with gcc that NEED a gcc-built libcudart.so.12 / libcublas.so.12 (or .13
for the CUDA 13 stand-ins the venv starts with). A test policy is the real policy.toml with the
four artifacts' URL and sha256 replaced by the stand-ins'; the real policy is untouched.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import tomllib
import zipfile
from pathlib import Path
from urllib.parse import quote

import importlib.metadata as md
import pytest

from rftstack.bundle import flavour
from rftstack.stack import lockfile, policy
from rftstack.doctor.checks import elf

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("uv") is None, reason="needs gcc and uv")

REPO = Path(__file__).resolve().parents[2]
TAG = f"cp{sys.version_info[0]}{sys.version_info[1]}"
PLAT = "manylinux_2_28_x86_64"


# ------------------------------------------------------------------------------------------------
# Stand-in wheels
# ------------------------------------------------------------------------------------------------


def _so(out: Path, soname: str, src: str, links: tuple[tuple[Path, str], ...] = ()) -> bytes:
    c = out.with_suffix(".c")
    c.write_text(src)
    cmd = ["gcc", "-shared", "-fPIC", "-o", str(out), str(c), f"-Wl,-soname,{soname}"]
    for lib_dir, name in links:
        cmd += [f"-L{lib_dir}", f"-l:{name}"]
    subprocess.run(cmd, check=True, capture_output=True)
    return out.read_bytes()


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(out_dir: Path, filename: str, name: str, version: str, files: dict[str, bytes], requires: list[str] = (), broken: bool = False) -> Path:
    """A real wheel zip; ``broken`` leaves out the WHEEL file (installers refuse it)."""
    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    entries = dict(files)
    entries[f"{dist_info}/METADATA"] = meta.encode()
    if not broken:
        from packaging.utils import parse_wheel_filename

        tags = "".join(f"Tag: {t}\n" for t in sorted(str(t) for t in parse_wheel_filename(filename)[3]))
        entries[f"{dist_info}/WHEEL"] = f"Wheel-Version: 1.0\nGenerator: rftstack-test\nRoot-Is-Purelib: false\n{tags}".encode()
    record = "".join(f"{k},{_hash(v)},{len(v)}\n" for k, v in entries.items()) + f"{dist_info}/RECORD,,\n"
    entries[f"{dist_info}/RECORD"] = record.encode()
    path = out_dir / filename
    with zipfile.ZipFile(path, "w") as z:
        for k, v in entries.items():
            z.writestr(zipfile.ZipInfo(k, (2020, 1, 1, 0, 0, 0)), v)
    return path


def real_filename(lock_text: dict, name: str) -> str:
    pkg = next(p for p in lock_text["package"] if p["name"] == name)
    return next(w["url"].rsplit("/", 1)[-1] for w in pkg["wheels"] if "x86_64" in w["url"])


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    """STAND-IN wheels: the CUDA 13 set a synced venv starts with, and the CUDA 12 set the server serves."""
    work = tmp_path_factory.mktemp("standins")
    libs = work / "libs"
    libs.mkdir()
    so = {}
    for major in (12, 13):
        so[f"cudart{major}"] = _so(libs / f"libcudart.so.{major}", f"libcudart.so.{major}", "int cudaRuntimeGetVersion(int*v){*v=1;return 0;}")
        so[f"cublas{major}"] = _so(libs / f"libcublas.so.{major}", f"libcublas.so.{major}", "int cublasCreate_v2(void*h){return 0;}")
        src = "int cudaRuntimeGetVersion(int*);int cublasCreate_v2(void*);int g(void){int v;cublasCreate_v2(0);return cudaRuntimeGetVersion(&v);}"
        so[f"user{major}"] = _so(libs / f"user{major}.so", f"libuser{major}.so", src,
                                 ((libs, f"libcudart.so.{major}"), (libs, f"libcublas.so.{major}")))
    real_lock = tomllib.loads((REPO / "uv.lock").read_text())
    cu13, cu12 = work / "cu13", work / "cu12"
    cu13.mkdir()
    cu12.mkdir()
    linux = '; platform_system == "Linux"'
    w13 = [
        make_wheel(cu13, f"torch-2.11.0-{TAG}-{TAG}-{PLAT}.whl", "torch", "2.11.0",
                   {"torch/__init__.py": b"", "torch/lib/libtorch_cuda.so": so["user13"]},
                   [f"cuda-toolkit[cublas,cudart]==13.0.2{linux}", f"nvidia-cudnn-cu13==9.19.0.56{linux}", "cuda-bindings<14,>=13.0.3"]),
        make_wheel(cu13, f"torchvision-0.26.0-{TAG}-{TAG}-{PLAT}.whl", "torchvision", "0.26.0", {"torchvision/__init__.py": b""}, ["torch==2.11.0"]),
        make_wheel(cu13, f"torchaudio-2.11.0-{TAG}-{TAG}-{PLAT}.whl", "torchaudio", "2.11.0", {"torchaudio/__init__.py": b""}, ["torch==2.11.0"]),
        make_wheel(cu13, f"vllm-0.23.0-cp38-abi3-{PLAT}.whl", "vllm", "0.23.0", {"vllm/__init__.py": b"", "vllm/_C.abi3.so": so["user13"]}, ["torch==2.11.0"]),
        make_wheel(cu13, "cuda_toolkit-13.0.2-py2.py3-none-any.whl", "cuda-toolkit", "13.0.2", {},
                   ['nvidia-cuda-runtime==13.0.96.*; extra == "cudart"', 'nvidia-cublas==13.1.0.3.*; extra == "cublas"']),
        make_wheel(cu13, real_filename(real_lock, "nvidia-cuda-runtime"), "nvidia-cuda-runtime", "13.0.96",
                   {"nvidia/cu13/lib/libcudart.so.13": so["cudart13"]}),
        make_wheel(cu13, real_filename(real_lock, "nvidia-cublas"), "nvidia-cublas", "13.1.0.3", {"nvidia/cu13/lib/libcublas.so.13": so["cublas13"]}),
        make_wheel(cu13, real_filename(real_lock, "nvidia-cudnn-cu13"), "nvidia-cudnn-cu13", "9.19.0.56", {"nvidia/cudnn/__init__.py": b"13"}, ["nvidia-cublas"]),
        make_wheel(cu13, "cuda_bindings-13.4.4-cp311-abi3-manylinux_2_28_x86_64.whl", "cuda-bindings", "13.4.4", {"cuda/bindings/__init__.py": b""}),
        make_wheel(cu13, "nvidia_ml_py-13.595.45-py3-none-any.whl", "nvidia-ml-py", "13.595.45", {"pynvml.py": b""}),
    ]
    pol = policy.load()
    real = {a.name: a for a in pol.artifacts}
    own = {a: real[a].filename.replace("cp312-cp312", f"{TAG}-{TAG}") for a in real}
    w12 = {
        "torch": make_wheel(cu12, own["torch"], "torch", "2.11.0+cu128",
                            {"torch/__init__.py": b"", "torch/lib/libtorch_cuda.so": so["user12"]},
                            [f"cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==12.8.1{linux}",
                             f"cuda-bindings<13,>=12.9.4{linux}", f"nvidia-cudnn-cu12==9.19.0.56{linux}"]),
        "torchvision": make_wheel(cu12, own["torchvision"], "torchvision", "0.26.0+cu128", {"torchvision/__init__.py": b""}, ["torch==2.11.0"]),
        "torchaudio": make_wheel(cu12, own["torchaudio"], "torchaudio", "2.11.0+cu128", {"torchaudio/__init__.py": b""}, ["torch==2.11.0"]),
        "vllm": make_wheel(cu12, own["vllm"], "vllm", "0.23.0+cu129", {"vllm/__init__.py": b"", "vllm/_C.abi3.so": so["user12"]}, ["torch==2.11.0"]),
        "nvidia-cuda-runtime-cu12": make_wheel(cu12, real_filename(real_lock, "nvidia-cuda-runtime-cu12"), "nvidia-cuda-runtime-cu12", "12.8.90",
                                               {"nvidia/cuda_runtime/lib/libcudart.so.12": so["cudart12"]}),
        "nvidia-cublas-cu12": make_wheel(cu12, real_filename(real_lock, "nvidia-cublas-cu12"), "nvidia-cublas-cu12", "12.8.4.1",
                                         {"nvidia/cublas/lib/libcublas.so.12": so["cublas12"]}),
        "nvidia-cudnn-cu12": make_wheel(cu12, real_filename(real_lock, "nvidia-cudnn-cu12"), "nvidia-cudnn-cu12", "9.19.0.56",
                                        {"nvidia/cudnn/__init__.py": b"12"}, ["nvidia-cublas-cu12"]),
    }
    broken = work / "broken"
    broken.mkdir()
    w12_broken_vllm = make_wheel(broken, own["vllm"], "vllm", "0.23.0+cu129", {"vllm/__init__.py": b""}, ["torch==2.11.0"], broken=True)
    odd = work / "odd"
    odd.mkdir()
    w12_torch_nccl = make_wheel(odd, own["torch"], "torch", "2.11.0+cu128", {"torch/__init__.py": b""},
                                [f"nvidia-nccl-cu12==2.28.9{linux}"])  # a requirement the lock's group does not meet
    w12_vllm_cu13 = make_wheel(odd, own["vllm"], "vllm", "0.23.0+cu129", {"vllm/__init__.py": b"", "vllm/_C.abi3.so": so["user13"]},
                               ["torch==2.11.0"])  # a "CUDA 12" build that links libcudart.so.13
    xformers13 = make_wheel(odd, f"xformers-0.0.33-{TAG}-{TAG}-{PLAT}.whl", "xformers", "0.0.33", {"xformers/_C.so": so["user13"]})
    return {"cu13": w13, "cu12": w12, "broken_vllm": w12_broken_vllm, "torch_nccl": w12_torch_nccl, "vllm_cu13": w12_vllm_cu13,
            "xformers13": xformers13, "work": work}


# ------------------------------------------------------------------------------------------------
# A local server, a test lock, a test policy
# ------------------------------------------------------------------------------------------------


class Server:
    """Serves files by name on 127.0.0.1 (a free port); ``truncate`` names are cut off half-way
    (Content-Length says the whole file, the connection closes early)."""

    def __init__(self, files: dict[str, Path]):
        self.files = dict(files)
        self.truncate: set[str] = set()
        self.requests: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                from urllib.parse import unquote

                name = unquote(self.path.lstrip("/"))
                outer.requests.append(name)
                if name not in outer.files:
                    self.send_error(404)
                    return
                data = outer.files[name].read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2] if name in outer.truncate else data)
                if name in outer.truncate:
                    self.close_connection = True

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def write_lock(path: Path, server: Server, wheels: dict[str, Path]) -> Path:
    """A uv.lock (version 1) of a virtual root project: the CUDA 13 stack as its dependencies,
    three stand-in nvidia-*-cu12 libraries as its `cuda12` group, served by ``server``."""
    def pkg(name, version, deps=(), wheel: Path | None = None, registry=True):
        out = f'\n[[package]]\nname = "{name}"\nversion = "{version}"\n'
        out += 'source = { registry = "https://pypi.org/simple" }\n' if registry else 'source = { virtual = "." }\n'
        if deps:
            out += "dependencies = [\n" + "".join(f'    {{ name = "{d}" }},\n' for d in deps) + "]\n"
        if wheel is not None:
            data = wheel.read_bytes()
            out += (f'wheels = [\n    {{ url = "{server.url}/{quote(wheel.name)}", hash = "sha256:{hashlib.sha256(data).hexdigest()}", '
                    f"size = {len(data)} }},\n]\n")
        return out

    text = 'version = 1\nrevision = 3\nrequires-python = ">=3.11"\n'
    text += pkg("standin-project", "0.1.0", ["torch", "torchvision", "torchaudio", "vllm", "nvidia-ml-py"], registry=False)
    text += "\n[package.dev-dependencies]\ncuda12 = [\n" + "".join(
        f'    {{ name = "{n}" }},\n' for n in ("nvidia-cuda-runtime-cu12", "nvidia-cublas-cu12", "nvidia-cudnn-cu12")) + "]\n"
    text += pkg("torch", "2.11.0", ["cuda-toolkit", "nvidia-cudnn-cu13", "cuda-bindings"])
    text += pkg("torchvision", "0.26.0", ["torch"]) + pkg("torchaudio", "2.11.0", ["torch"]) + pkg("vllm", "0.23.0", ["torch"])
    text += pkg("cuda-toolkit", "13.0.2") + pkg("nvidia-cudnn-cu13", "9.19.0.56") + pkg("cuda-bindings", "13.4.4") + pkg("nvidia-ml-py", "13.595.45")
    text += pkg("nvidia-cuda-runtime-cu12", "12.8.90", wheel=wheels["nvidia-cuda-runtime-cu12"])
    text += pkg("nvidia-cublas-cu12", "12.8.4.1", wheel=wheels["nvidia-cublas-cu12"])
    text += pkg("nvidia-cudnn-cu12", "9.19.0.56", ["nvidia-cublas-cu12"], wheel=wheels["nvidia-cudnn-cu12"])
    path.write_text(text)
    return path


def write_policy(path: Path, server: Server, wheels: dict[str, Path], sha_override: dict[str, str] | None = None) -> Path:
    """The real policy.toml with each [[cuda12.artifact]]'s url/sha256 pointing at a stand-in."""
    text = policy.DEFAULT_PATH.read_text()
    for name in ("torch", "torchvision", "torchaudio", "vllm"):
        w = wheels[name]
        sha = (sha_override or {}).get(name) or hashlib.sha256(w.read_bytes()).hexdigest()
        block = re.compile(r'(\[\[cuda12\.artifact\]\]\nname = "' + name + r'"\n(?:.*\n)*?)url = ".*"\nsha256 = ".*"\n')
        text, n = block.subn(lambda m, w=w, sha=sha: m.group(1) + f'url = "{server.url}/{quote(w.name)}"\nsha256 = "{sha}"\n', text, count=1)  # type: ignore[misc]
        assert n == 1, name
    text = text.replace('python = "cp312"', f'python = "{TAG}"')
    path.write_text(text)
    return path


def make_venv(path: Path, wheels: list[Path]) -> Path:
    subprocess.run(["uv", "venv", "--quiet", "--python", sys.executable, str(path)], check=True, capture_output=True)
    py = path / "bin" / "python"
    subprocess.run(["uv", "pip", "install", "--quiet", "--python", str(py), "--no-deps", "--no-index", *map(str, wheels)], check=True, capture_output=True)
    return py


def snapshot(venv: Path) -> dict[str, str]:
    """Every file under the venv (the backup and cache folders aside) -> sha256, plus the dists."""
    out = {}
    for p in sorted(venv.rglob("*")):
        rel = str(p.relative_to(venv))
        if rel.startswith((flavour.BACKUP_DIR, ".rftstack-flavour-cache")) or not p.is_file():
            continue
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    sites = [str(s) for s in venv.glob("lib/python*/site-packages")]
    out["@dists"] = ",".join(sorted(f"{d.metadata['Name']}=={d.version}" for d in md.distributions(path=sites)))
    return out


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    return subprocess.run([sys.executable, "-m", "rftstack", *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture()
def setup(standins, tmp_path):
    server = Server({p.name: p for p in standins["cu12"].values()})
    lock = write_lock(tmp_path / "uv.lock", server, standins["cu12"])
    pol = write_policy(tmp_path / "policy.toml", server, standins["cu12"])
    venv = tmp_path / "venv"
    py = make_venv(venv, standins["cu13"])
    yield {"server": server, "lock": lock, "policy": pol, "venv": venv, "py": py, "tmp": tmp_path}
    server.close()


def swap_args(s, *extra: str) -> list[str]:
    return ["flavour", "cuda12", "--python", str(s["py"]), "--lock", str(s["lock"]), "--policy", str(s["policy"]), "--retries", "0", *extra]


# ------------------------------------------------------------------------------------------------
# The lock
# ------------------------------------------------------------------------------------------------


def test_lock_holds_the_cuda12_group_hashed_and_the_default_sync_set_is_unchanged():
    """uv.lock's cuda12 group: the 15 nvidia-*-cu12 wheels torch 2.11.0+cu128 asks for, each with a
    manylinux x86-64 wheel, sha256 and size; `uv sync` (default groups: dev) installs none of them."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["tool"]["uv"]["default-groups"] == ["dev"]
    pins = dict(r.split("==") for r in pyproject["dependency-groups"]["cuda12"])
    assert len(pins) == 15 and all(n.startswith("nvidia-") and n.endswith("-cu12") for n in pins)
    assert pins["nvidia-cuda-runtime-cu12"] == "12.8.90" and pins["nvidia-cudnn-cu12"] == "9.19.0.56" and pins["nvidia-nccl-cu12"] == "2.28.9"
    lock = lockfile.load(REPO / "uv.lock")
    by = {p.name: p for p in lock.packages}
    for name, version in pins.items():
        assert by[name].version == version
        wheels = [w for w in by[name].wheels if "x86_64" in w.filename and "manylinux" in w.filename]
        assert wheels and all(len(w.sha256) == 64 and w.size for w in wheels), name
    env = lockfile.target_environment("3.12")
    default = lock.resolve(env, groups=("dev",))
    assert not [n for n in default if n.endswith("-cu12")]
    assert set(pins) <= set(lock.resolve(env, groups=("dev", "cuda12")))
    assert set(lock.group(env, "cuda12")) == set(pins)  # the group pulls nothing beyond itself
    exported = subprocess.run(["uv", "export", "--frozen", "--no-hashes", "--format", "requirements-txt", "--project", str(REPO)],
                              capture_output=True, text=True, check=True).stdout
    assert "cu12==" not in exported and "torch==2.11.0" in exported
    with_group = subprocess.run(["uv", "export", "--frozen", "--no-hashes", "--group", "cuda12", "--format", "requirements-txt", "--project", str(REPO)],
                                capture_output=True, text=True, check=True).stdout
    assert all(f"{n}=={v}" in with_group for n, v in pins.items())


# ------------------------------------------------------------------------------------------------
# The swap
# ------------------------------------------------------------------------------------------------


def _needed_sonames(venv: Path) -> set[str]:
    out = set()
    for p in venv.rglob("*.so*"):
        links = elf.read_links(p)
        if links:
            out |= set(links.needed)
    return out


def test_swap_installs_cuda12_removes_cuda13_and_is_idempotent(setup):
    s = setup
    sites = [str(p) for p in s["venv"].glob("lib/python*/site-packages")]
    assert "libcudart.so.13" in _needed_sonames(s["venv"])
    assert flavour.installed_flavour({policy.canonical(d.metadata["Name"]): d.version for d in md.distributions(path=sites)}, policy.load(s["policy"])) == "cuda13"

    r = run_cli(*swap_args(s, "--json"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["state"] == "swapped" and out["cuda13_left"] == []
    have = {policy.canonical(d.metadata["Name"]): d.version for d in md.distributions(path=sites)}
    assert have == {
        "torch": "2.11.0+cu128", "torchvision": "0.26.0+cu128", "torchaudio": "2.11.0+cu128", "vllm": "0.23.0+cu129",
        "nvidia-cuda-runtime-cu12": "12.8.90", "nvidia-cublas-cu12": "12.8.4.1", "nvidia-cudnn-cu12": "9.19.0.56",
        "cuda-bindings": "13.4.4", "nvidia-ml-py": "13.595.45",
    }
    needed = _needed_sonames(s["venv"])
    assert {"libcudart.so.12", "libcublas.so.12"} <= needed
    assert not needed & {"libcudart.so.13", "libcublas.so.13"}
    assert all(d.cuda_major == 12 for d in elf.scan(md.distributions(path=sites)))
    torch_meta = next(d for d in md.distributions(path=sites) if d.metadata["Name"] == "torch").metadata.get_all("Requires-Dist")
    assert not [r for r in torch_meta if r.startswith("cuda-toolkit")]
    assert 'cuda-bindings>=12.9.4; platform_system == "Linux"' in torch_meta
    check = subprocess.run(["uv", "pip", "check", "--python", str(s["py"])], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert not (s["venv"] / flavour.BACKUP_DIR).exists() or not any((s["venv"] / flavour.BACKUP_DIR).iterdir())
    assert not (s["venv"] / flavour.CACHE_DIR).exists()  # the default download cache goes after success

    before, n_requests = snapshot(s["venv"]), len(s["server"].requests)
    again = run_cli(*swap_args(s))
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stderr
    assert snapshot(s["venv"]) == before and len(s["server"].requests) == n_requests

    # `rftstack env` run by the swapped venv's python: the CUDA 12 flavour, the group expected, nothing missing
    subprocess.run(["uv", "pip", "install", "--quiet", "--python", str(s["py"]), "packaging"], check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(REPO / "python"), "RFTSTACK_POLICY": str(s["policy"])}
    rep = subprocess.run([str(s["py"]), "-m", "rftstack", "env", "--json", "--lock", str(s["lock"])], capture_output=True, text=True, env=env)
    rep = json.loads(rep.stdout)
    assert rep["flavour"] == "cuda12" and rep["problems"] == [] and rep["counts"]["missing"] == 0
    assert not [n for n in rep["extra"] if "cu12" in n] and rep["counts"]["flavour"] == 4
    text = subprocess.run([str(s["py"]), "-m", "rftstack", "env", "--lock", str(s["lock"])], capture_output=True, text=True, env=env).stdout
    assert "flavour CUDA 12 (policy.toml [cuda12] builds and the lock's cuda12 group, driver >= 570)" in text


@pytest.mark.parametrize("fault", ["hash", "truncated", "install", "requirement", "elf-new", "elf-staying"])
def test_failed_swap_leaves_the_environment_as_it_was(setup, standins, fault):
    """A wrong hash and a truncated download are refused before anything changes; an installer
    failure after the CUDA 13 files were moved aside puts them back. One sentence each."""
    s = setup
    if fault == "hash":
        write_policy(s["policy"], s["server"], standins["cu12"], sha_override={"vllm": "0" * 64})
    elif fault == "truncated":
        s["server"].truncate.add(standins["cu12"]["torch"].name)
    elif fault == "elf-new":  # installed, then found to link libcudart.so.13: uninstalled, CUDA 13 files moved back
        wheels = dict(standins["cu12"], vllm=standins["vllm_cu13"])
        s["server"].files[standins["vllm_cu13"].name] = standins["vllm_cu13"]
        write_policy(s["policy"], s["server"], wheels)
    elif fault == "elf-staying":  # a CUDA 13 extension the policy knows nothing about: refused before anything changes
        subprocess.run(["uv", "pip", "install", "--quiet", "--python", str(s["py"]), "--no-deps", "--no-index", str(standins["xformers13"])],
                       check=True, capture_output=True)
    elif fault == "requirement":  # a build asking for a library the lock's group does not hold
        wheels = dict(standins["cu12"], torch=standins["torch_nccl"])
        s["server"].files[standins["torch_nccl"].name] = standins["torch_nccl"]
        write_policy(s["policy"], s["server"], wheels)
    else:  # the policy's hash matches a stand-in vllm that no installer accepts (no WHEEL file)
        wheels = dict(standins["cu12"], vllm=standins["broken_vllm"])
        s["server"].files[standins["broken_vllm"].name] = standins["broken_vllm"]
        write_policy(s["policy"], s["server"], wheels)
    before = snapshot(s["venv"])
    r = run_cli(*swap_args(s))
    assert r.returncode != 0
    lines = [l for l in r.stderr.splitlines() if l.startswith("rftstack flavour:")]
    assert len(lines) == 1, r.stderr
    msg = lines[0]
    if fault == "hash":
        assert "sha256" in msg and "0" * 64 in msg and "vllm-0.23.0+cu129" in msg
    elif fault == "truncated":
        assert "torch-2.11.0+cu128" in msg and "IncompleteRead" in msg
    elif fault == "elf-new":
        assert "vllm 0.23.0+cu129 (vllm/_C.abi3.so needs libcudart.so.13)" in msg and "put back as it was" in msg
    elif fault == "elf-staying":
        assert "xformers 0.0.33 (xformers/_C.so needs libcudart.so.13) would still need CUDA 13" in msg and "nothing was changed" in msg
        assert s["server"].requests == []
    elif fault == "requirement":
        assert "torch 2.11.0+cu128 requires nvidia-nccl-cu12==2.28.9, which the swap leaves uninstalled" in msg and "nothing was changed" in msg
    else:
        assert "installing the CUDA 12 wheels failed" in msg and "put back as it was" in msg
    assert snapshot(s["venv"]) == before


def test_from_dir_needs_every_file_and_then_downloads_nothing(setup, standins):
    s = setup
    d = s["tmp"] / "predownloaded"
    d.mkdir()
    for w in list(standins["cu12"].values())[:-1]:
        shutil.copy(w, d)
    before = snapshot(s["venv"])
    r = run_cli(*swap_args(s, "--from", str(d)))
    assert r.returncode == 2 and f"--from {d} has no {standins['cu12']['nvidia-cudnn-cu12'].name}" in r.stderr
    assert snapshot(s["venv"]) == before
    (d / standins["cu12"]["nvidia-cudnn-cu12"].name).write_bytes(b"not the wheel")
    r = run_cli(*swap_args(s, "--from", str(d)))
    assert r.returncode == 1 and "is 13 bytes, but uv.lock says" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert snapshot(s["venv"]) == before
    shutil.copy(standins["cu12"]["vllm"], d / standins["cu12"]["torch"].name)  # right size nowhere, wrong file
    r = run_cli(*swap_args(s, "--from", str(d)))
    assert r.returncode == 1 and "has sha256" in r.stderr and "but policy.toml says" in r.stderr
    assert snapshot(s["venv"]) == before
    shutil.copy(standins["cu12"]["torch"], d)
    shutil.copy(standins["cu12"]["nvidia-cudnn-cu12"], d)
    r = run_cli(*swap_args(s, "--from", str(d)))
    assert r.returncode == 0, r.stderr
    assert s["server"].requests == []


def test_env_names_the_flavour_and_expects_the_group(setup, standins):
    s = setup
    pol = policy.load(s["policy"])
    lock = lockfile.load(s["lock"])
    assert "nvidia-cudnn-cu13" in flavour_env_expected(lock, pol, "cuda13")
    cu12 = flavour_env_expected(lock, pol, "cuda12")
    assert {"nvidia-cuda-runtime-cu12", "nvidia-cudnn-cu12", "torch", "cuda-bindings"} <= set(cu12)
    assert not {"cuda-toolkit", "nvidia-cudnn-cu13"} & set(cu12)
    assert flavour.installed_flavour({"torch": "2.11.0+cu128", "torchvision": "0.26.0+cu128", "torchaudio": "2.11.0", "vllm": "0.23.0"}, pol) == "mixed"
    assert flavour.installed_flavour({}, pol) == "none"


def flavour_env_expected(lock, pol, flav):
    from rftstack.stack import env_report

    return env_report.expected(lock, pol, flav)


def test_wrong_python_is_refused_in_one_sentence(setup):
    """The real policy's builds are cp312: another Python is refused before anything is fetched."""
    s = setup
    if TAG == "cp312":
        pytest.skip("this interpreter is 3.12, the real builds fit")
    r = run_cli("flavour", "cuda12", "--python", str(s["py"]), "--lock", str(s["lock"]))
    assert r.returncode == 2 and "does not run on CPython" in r.stderr and "Python 3.12" in r.stderr
    assert s["server"].requests == []


def test_bundle_build_flavour_cuda12_sends_the_stand_ins_and_no_cuda13(setup, standins, tmp_path):
    """`bundle build --flavour cuda12` from the test lock and policy: the policy's (stand-in) CUDA 12
    builds by URL and sha256, the cuda12 group, nothing CUDA 13; a wrong hash is refused."""
    s = setup
    out = tmp_path / "bundle"
    args = ["bundle", "build", "--out", str(out), "--lock", str(s["lock"]), "--flavour", "cuda12", "--policy", str(s["policy"]),
            "--python", f"{sys.version_info[0]}.{sys.version_info[1]}", "--platform", PLAT, "--exclude", "standin-project",
            "--exclude", "cuda-bindings", "--exclude", "nvidia-ml-py", "--json"]  # the test lock has no wheels of these two
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["flavour"] == summary["flavour"] == "cuda12"
    files = {f["dist"]: f for f in manifest["files"]}
    assert set(files) == {"torch", "torchvision", "torchaudio", "vllm", "nvidia-cuda-runtime-cu12", "nvidia-cublas-cu12",
                          "nvidia-cudnn-cu12"}
    for name in ("torch", "vllm"):
        assert files[name]["sha256"] == hashlib.sha256(standins["cu12"][name].read_bytes()).hexdigest()
        assert files[name]["source"].startswith(s["server"].url)
    # a driver-570 environment that has the CUDA 13 builds: the bundle's download cache is a --from DIR
    n_requests = len(s["server"].requests)
    r = run_cli(*swap_args(s, "--from", str(out / ".files" / "wheels")))
    assert r.returncode == 0, r.stderr
    assert len(s["server"].requests) == n_requests
    write_policy(s["policy"], s["server"], standins["cu12"], sha_override={"torch": "0" * 64})
    shutil.rmtree(out)
    r = run_cli(*args)
    assert r.returncode == 1 and "policy.toml says " + "0" * 64 in r.stderr


def test_uv_run_puts_the_locked_build_back(tmp_path):
    """Guards an upstream (uv) behaviour the README relies on: after a swap, `uv run` in the project
    re-syncs and replaces a local-version build (here six 1.17.0+standin, a STAND-IN wheel) with the
    locked one, and `uv run --no-sync` / the venv's own bin/ do not."""
    proj = tmp_path / "p"
    proj.mkdir()
    (proj / "pyproject.toml").write_text('[project]\nname = "p"\nversion = "0"\nrequires-python = ">=3.11"\n'
                                         'dependencies = ["six==1.17.0"]\n[tool.uv]\npackage = false\n')
    subprocess.run(["uv", "sync", "--quiet", "--python", sys.executable], cwd=proj, check=True, capture_output=True)
    whl = make_wheel(tmp_path, "six-1.17.0+standin-py3-none-any.whl", "six", "1.17.0+standin", {"six.py": b"X = 1\n"})
    py = proj / ".venv" / "bin" / "python"
    subprocess.run(["uv", "pip", "install", "--quiet", "--python", str(py), "--no-deps", str(whl)], check=True, capture_output=True)
    probe = ["python", "-c", "import importlib.metadata as m; print(m.version('six'))"]
    def version(*cmd):
        return subprocess.run(list(cmd), cwd=proj, capture_output=True, text=True, check=True).stdout.strip()
    assert version(str(py), *probe[1:]) == "1.17.0+standin"
    assert version("uv", "run", "--no-sync", *probe) == "1.17.0+standin"
    assert version("uv", "run", *probe) == "1.17.0"


def test_restore_moves_a_backup_back(setup):
    """What the failure sentence tells a user to run when undoing failed: `rftstack flavour restore
    BACKUP` puts every moved file back (and again is a no-op)."""
    s = setup
    before = snapshot(s["venv"])
    target = flavour.probe(str(s["py"]))
    dists = flavour.installed(target)
    backup = flavour.back_up([dists["torch"], dists["nvidia-cuda-runtime"]], target)
    assert snapshot(s["venv"]) != before and "torch" not in flavour.installed(target)
    r = run_cli("flavour", "restore", str(backup), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["restored"] > 0, r.stderr
    assert snapshot(s["venv"]) == before
    assert json.loads(run_cli("flavour", "restore", str(backup), "--json").stdout)["restored"] == 0
    bad = run_cli("flavour", "restore", str(s["tmp"]))
    assert bad.returncode == 2 and "is not a flavour backup" in bad.stderr
