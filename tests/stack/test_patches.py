"""patches: strict application of policy patches, and the torch TCPStore patch really closing a socket."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import torch
import uvicorn_helpers

from rftstack.stack import patches
from rftstack.stack import policy

from patch_helpers import add_ray, add_trinity, add_verl, add_vllm

TORCH = Path(torch.__file__).parent
SITE = TORCH.parent
REL = "torch/distributed/rendezvous.py"


@pytest.fixture
def site(tmp_path):
    """A site-packages holding torch's real rendezvous.py and dist-info (METADATA + a RECORD)."""
    (tmp_path / "torch/distributed").mkdir(parents=True)
    text = (SITE / REL).read_text()
    # the installed torch may be patched already (CI applies the policy first): start from the original
    text = patches.undo(text, patches.patches_dir() / the_patch().file, REL)
    (tmp_path / REL).write_text(text)
    real_info = next(SITE.glob("torch-*.dist-info"))
    info = tmp_path / real_info.name
    info.mkdir()
    shutil.copy(real_info / "METADATA", info / "METADATA")
    line = next(l for l in (real_info / "RECORD").read_text().splitlines() if l.startswith(REL + ","))
    (info / "RECORD").write_text(f"torch/__init__.py,,\n{line}\n")
    add_trinity(tmp_path)
    uvicorn_helpers.add_uvicorn(tmp_path)
    add_verl(tmp_path)
    add_ray(tmp_path)
    add_vllm(tmp_path)
    return tmp_path


def the_patch():
    (p,) = [p for p in policy.load().patches if p.dist == "torch"]
    return p


def apply(site, **over):
    p = the_patch()
    args = dict(expect_sha256=p.sha256, dist=p.dist, version=p.version)
    args.update(over)
    return patches.apply(site, patches.patches_dir() / p.file, **args)


def test_policy_names_the_patch_with_its_hash():
    for p in policy.load().patches:
        assert patches.sha256(patches.patches_dir() / p.file) == p.sha256
        assert p.why


def test_apply_is_strict_idempotent_and_updates_record(site):
    before = (site / REL).read_text()
    assert apply(site) == [(REL, "applied")]
    after = (site / REL).read_text()
    assert "_loopback_listen_fd" in after and after != before
    record = next(site.glob("torch-*.dist-info/RECORD")).read_text()
    assert patches.record_hash(after.encode()) in record
    assert apply(site) == [(REL, "already applied")]
    assert (site / REL).read_text() == after


def test_refusals(site, tmp_path):
    with pytest.raises(patches.PatchError, match="sha256"):
        apply(site, expect_sha256="0" * 64)
    with pytest.raises(patches.PatchError, match="install the locked version"):
        apply(site, version="2.10.0")
    text = (site / REL).read_text().replace("start_daemon = rank == 0", "start_daemon = rank == 1")
    (site / REL).write_text(text)
    with pytest.raises(patches.PatchError, match="matches neither"):
        apply(site)
    assert (site / REL).read_text() == text  # nothing written


PROBE = r"""
import os, socket, sys
import torch.distributed as dist
import torch.distributed.rendezvous
r = sys.modules["torch.distributed.rendezvous"]  # the attribute of that name is a function
if sys.argv[1] != "-":
    exec(compile(open(sys.argv[1]).read(), sys.argv[1], "exec"), r.__dict__)
sys.path.insert(0, sys.argv[2])
from rftstack.doctor import netstat
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
mine = netstat.socket_inodes(os.getpid())
print(" ".join(f"{l.address}|{l.port}|{int(l.loopback)}" for l in netstat.listeners() if l.inode in mine))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("patched", [False, True])
def test_tcp_rendezvous_listens_on_loopback_only_when_patched(site, patched):
    if patched:
        apply(site)
    env = {"GLOO_SOCKET_IFNAME": "lo", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", PROBE, str(site / REL), str(Path(patches.__file__).parents[1])],
                         capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    socks = [s.split("|") for s in out.stdout.split()]
    assert socks
    outside = [s for s in socks if s[2] == "0"]
    if patched:
        assert outside == []
    else:
        assert outside, "unpatched torch is expected to listen on a wildcard address"


def test_standalone_script_on_a_bare_python(site, tmp_path):
    """The Nix build runs patches.py next to policy.py with a bare Python (no rftstack package)."""
    bare = tmp_path / "bare"
    bare.mkdir()
    pkg = Path(patches.__file__).parent
    for name in ("patches.py", "policy.py"):
        shutil.copy(pkg / name, bare / name)
    cmd = [sys.executable, "-S", "-I", str(bare / "patches.py"), str(site), "--policy", str(pkg.parent / "data" / "policy.toml"),
           "--patches", str(patches.patches_dir())]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"torch-tcpstore-loopback.patch: {REL}: applied",
        "verl-unpad-without-flash-attn.patch: verl/utils/attention_utils.py: applied",
        "trinity-proxy-store-errors.patch: trinity/explorer/proxy/app.py: applied",
        "trinity-proxy-stream-record.patch: trinity/explorer/proxy/app.py: applied",
        "trinity-synchronizer-unparsable-sleep.patch: trinity/manager/synchronizer.py: applied",
        "trinity-explorer-node.patch: trinity/explorer/explorer.py: applied",
        "trinity-proxy-feedback-errors.patch: trinity/explorer/proxy/app.py: applied",
        "trinity-proxy-feedback-errors.patch: trinity/explorer/proxy/service.py: applied",
        "trinity-recorder-group-commit.patch: trinity/explorer/proxy/recorder.py: applied",
        "trinity-proxy-reload-wait.patch: trinity/explorer/proxy/service.py: applied",
        "trinity-proxy-commit-marks.patch: trinity/explorer/proxy/service.py: applied",
        "trinity-proxy-commit-marks.patch: trinity/explorer/proxy/recorder.py: applied",
        "trinity-proxy-request-hygiene.patch: trinity/explorer/proxy/app.py: applied",
        "uvicorn-httptools-ignore-upgrade.patch: uvicorn/protocols/http/httptools_impl.py: applied",
        "trinity-proxy-fast-forward.patch: trinity/explorer/proxy/app.py: applied",
        "trinity-sql-read-requeue.patch: trinity/buffer/storage/sql.py: applied",
        "trinity-sql-read-requeue.patch: trinity/algorithm/sample_strategy/sample_strategy.py: applied",
        "trinity-proxy-api-key.patch: trinity/explorer/proxy/app.py: applied",
        "trinity-proxy-gc.patch: trinity/explorer/proxy/app.py: applied",
        "trinity-launcher-head-env.patch: trinity/cli/launcher.py: applied",
        "ray-prestart-workers.patch: ray/_private/services.py: applied",
        "trinity-engine-uni-executor.patch: trinity/common/models/vllm_model.py: applied",
        "trinity-coordinator-early.patch: trinity/explorer/explorer.py: applied",
        "vllm-logprobs-numeric.patch: vllm/entrypoints/openai/chat_completion/serving.py: applied",
        "vllm-logprobs-numeric.patch: vllm/v1/engine/logprobs.py: applied",
        "trinity-proxy-numeric-logprobs.patch: trinity/explorer/proxy/app.py: applied",
        "trinity-proxy-numeric-logprobs.patch: trinity/explorer/proxy/service.py: applied",
        "vllm-fork-workers.patch: vllm/utils/system_utils.py: applied",
        "trinity-proxy-build-processes.patch: trinity/explorer/proxy/service.py: applied",
        "trinity-proxy-build-processes.patch: trinity/explorer/proxy/recorder.py: applied",
        "trinity-proxy-build-processes.patch: trinity/explorer/proxy/app.py: applied",
        "trinity-proxy-builders-early.patch: trinity/explorer/explorer.py: applied",
        "trinity-proxy-builders-early.patch: trinity/explorer/proxy/service.py: applied",
        "trinity-engine-log-stats.patch: trinity/common/models/vllm_model.py: applied",
        "trinity-engine-anyio-root.patch: trinity/common/models/vllm_patch/api_patch_v17.py: applied",
    ]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and all(l.endswith("already applied") for l in again.stdout.splitlines())


def test_state_reports_without_writing(site):
    before = (site / REL).read_text()
    names = [p.file for p in policy.load().patches]
    assert patches.state(site) == [(n, "not applied") for n in names]
    assert (site / REL).read_text() == before
    apply(site)
    assert patches.state(site)[0] == ("torch-tcpstore-loopback.patch", "applied")
    patches.apply_policy(site)
    assert patches.state(site) == [(n, "applied") for n in names]
    assert patches.state(site / "nowhere")[0][1].startswith("cannot apply")


def test_reversed_patch_restores_the_original(site):
    original = (site / REL).read_text()
    apply(site)
    text = (site / REL).read_text()
    for fp in patches.parse((patches.patches_dir() / the_patch().file).read_text()):
        assert fp.reversed().reversed() == fp
        text = patches.apply_text(text, fp.reversed())[0]
    assert text == original


def test_undo_gives_the_published_text_and_leaves_it_as_it_is(site):
    """patches.undo: the patched file back to the original; the original, and another file's text, unchanged."""
    original = (site / REL).read_text()
    apply(site)
    patched = (site / REL).read_text()
    patch_file = patches.patches_dir() / the_patch().file
    assert patched != original
    assert patches.undo(patched, patch_file, REL) == original
    assert patches.undo(original, patch_file, REL) == original
    assert patches.undo(patched, patch_file, "torch/other.py") == patched


TWO_HUNKS = """--- a/pkg/m.py
+++ b/pkg/m.py
@@ -2,3 +2,3 @@
 a = 1
-b = 2
+b = 20
 c = 3
@@ -12,3 +12,3 @@
 x = 1
-y = 2
+y = 20
 z = 3
"""


def _module(*, first: str = "b = 2", second: str = "y = 2") -> str:
    pad = [f"# line {i}" for i in range(6)]
    return "\n".join(["# m.py", "a = 1", first, "c = 3", *pad, "", "x = 1", second, "z = 3", ""])


def test_a_context_that_matches_twice_away_from_its_line_is_refused():
    """A hunk whose lines are not at the stated line and occur more than once elsewhere could go to
    either place: refused rather than guessed."""
    (fp,) = patches.parse(TWO_HUNKS)
    text = _module()
    assert patches.apply_text(text, fp)[1] == "applied"
    block = "x = 1\ny = 2\nz = 3"
    moved = text.replace(block, "# gone").replace("# line 0", block + "\n# line 0").replace("# line 3", block + "\n# line 3")
    with pytest.raises(patches.PatchError, match="matches neither"):
        patches.apply_text(moved, fp)


def test_a_half_patched_file_is_refused():
    """One hunk applied and the other not (an interrupted or hand-edited install): refused, never
    completed, since the file is neither the version the patch was made for nor the patched one."""
    (fp,) = patches.parse(TWO_HUNKS)
    assert patches.apply_text(_module(first="b = 20", second="y = 20"), fp)[1] == "already applied"
    with pytest.raises(patches.PatchError, match="partly patched already"):
        patches.apply_text(_module(first="b = 20"), fp)



APPEND = """--- a/m.py
+++ b/m.py
@@ -2,3 +2,5 @@
 a = 1
 b = 2
 c = 3
+
+d = 4
"""


def test_a_hunk_that_appends_to_the_file_is_applied_once():
    """A hunk adding lines at a file's end has no context below them: its original lines are still there
    once it is applied. Applied again it is "already applied" (the file unchanged), not appended twice
    (session S: trinity-proxy-build-processes.patch's first version, applied by the install and again by
    `python -m rftstack.stack.patches`, wrapped the proxy's lifespan in itself); undone it is the original."""
    (fp,) = patches.parse(APPEND)
    original = "# m.py\na = 1\nb = 2\nc = 3\n"
    patched, state = patches.apply_text(original, fp)
    assert state == "applied" and patched == original + "\nd = 4\n"
    assert patches.apply_text(patched, fp) == (patched, "already applied")
    assert patches.apply_text(patched, fp.reversed()) == (original, "applied")
    assert patches.apply_text(original, fp.reversed()) == (original, "already applied")
