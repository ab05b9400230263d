"""On a GPU: vLLM's kind of torch.distributed start (NCCL, tcp:// rendezvous, a gloo CPU group, one
all-reduce) listens on loopback only with serve's environment and the policy's torch patch.
Needs only torch (runs on a GPU host without the rest of the stack)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rftstack.stack import patches
from rftstack.stack import policy

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU here", allow_module_level=True)

REL = "torch/distributed/rendezvous.py"
SITE = Path(torch.__file__).parents[1]

PROBE = r"""
import os, socket, sys
import torch, torch.distributed as dist
import torch.distributed.rendezvous
r = sys.modules["torch.distributed.rendezvous"]
if sys.argv[1] != "-":
    exec(compile(open(sys.argv[1]).read(), sys.argv[1], "exec"), r.__dict__)
sys.path.insert(0, sys.argv[2])
from rftstack.doctor import netstat
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, device_id=torch.device("cuda:0"))
cpu = dist.new_group([0], backend="gloo")
t = torch.ones(4, device="cuda"); dist.all_reduce(t); torch.cuda.synchronize()
dist.all_reduce(torch.ones(2), group=cpu)
mine = netstat.socket_inodes(os.getpid())
print("SOCKS " + " ".join(f"{l.address}|{l.port}|{int(l.loopback)}" for l in netstat.listeners() if l.inode in mine))
print("SUM", float(t.sum()))
dist.destroy_process_group()
"""


def patched_copy(tmp_path) -> Path:
    (p,) = [p for p in policy.load().patches if p.dist == "torch"]
    text = (SITE / REL).read_text()
    for fp in patches.parse((patches.patches_dir() / p.file).read_text()):
        text = patches.apply_text(text, fp)[0]
    out = tmp_path / "rendezvous.py"
    out.write_text(text)
    return out


@pytest.mark.parametrize("patched", [False, True])
def test_nccl_rendezvous_sockets(tmp_path, patched):
    assert patches.state(SITE)[0][1] in ("applied", "not applied"), "the patch does not fit this torch"
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("NCCL_SOCKET", "GLOO_SOCKET"))}
    env.update(GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo")
    src = str(patched_copy(tmp_path)) if patched else "-"
    out = subprocess.run([sys.executable, "-c", PROBE, src, str(Path(patches.__file__).parents[1])],
                         capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(l for l in out.stdout.splitlines() if l.startswith("SOCKS"))
    socks = [s.split("|") for s in line.split()[1:]]
    print(patched, socks)
    assert socks
    outside = [s for s in socks if s[2] == "0"]
    if patched:
        assert outside == []
    elif patches.state(SITE)[0][1] == "not applied":
        assert outside  # the control: unpatched torch listens on a wildcard address
