"""The trainer's attention without flash-attn: `rftstack train` sets verl's model to `sdpa`.

Guards upstream behaviour: verl 0.8.0 builds the model's HF config with
`override_config.get("attn_implementation", "flash_attention_2")` (verl/workers/config/model.py) and
Trinity 0.6.0's `build_verl_config` leaves `override_config` empty unless `trainer.trainer_config`
fills it, so without flash_attn transformers refuses to build the model (the GPU host's first train
run died there). Real (in a subprocess): Trinity's `load_config` + `check_and_update` +
`build_verl_config`, verl's `HFModelConfig` built from that config, and transformers loading the
tiny model with the HF config verl built, as Trinity's FSDP `_build_module` does; the same test
runs the config without the change and shows transformers' ImportError.
"""

from __future__ import annotations

import json

import pytest
import yaml

from helpers import run_python
from rftstack.doctor.checks import trainside
from rftstack.findings import FAIL, OK
from rftstack.run import train_config


def base(model: str = "/models/m", ckpt: str = "/c") -> dict:
    return train_config.example(model, checkpoint_root_dir=ckpt, project="p", name="n", max_model_len=512, train_batch_size=4, total_steps=2)


def test_sdpa_when_flash_attn_is_missing_and_recorded():
    cfg, changes = train_config.effective(base(), ray_address="a", flash_attn=False)
    (c,) = [c for c in changes if "attn" in c.key]
    assert c.key == train_config.ATTN_KEY == "trainer.trainer_config.actor_rollout_ref.model.override_config.attn_implementation"
    assert (c.old, c.new) == (None, "sdpa") and "flash-attn does not import" in c.why
    assert cfg["trainer"]["trainer_config"] == {"actor_rollout_ref": {"model": {"override_config": {"attn_implementation": "sdpa"}}}}
    assert cfg["trainer"]["save_interval"] == 1 and cfg["trainer"]["total_steps"] == 2  # the rest of trainer kept


def test_no_change_with_flash_attn_or_when_the_user_chose():
    cfg, changes = train_config.effective(base(), ray_address="a", flash_attn=True)
    assert not [c for c in changes if "attn" in c.key] and "trainer_config" not in cfg["trainer"]
    for key in (train_config.ATTN_KEY, train_config.ATTN_KEY_FLAT):
        user = base()
        node = user
        for part in key.split(".")[:-1]:
            node = node.setdefault(part, {})
        node["attn_implementation"] = "eager"
        cfg, changes = train_config.effective(user, ray_address="a", flash_attn=False)
        assert not [c for c in changes if "attn" in c.key] and train_config.attn_implementation(cfg) == "eager"


def test_doctor_fails_an_explicit_flash_attention_2_without_flash_attn():
    (f,) = trainside.check_attention("flash_attention_2", flash_attn=False)
    assert f.status == FAIL and f.check == "train.attention"
    assert f.message == ("The train config asks verl for attn_implementation flash_attention_2, but flash_attn does not import in the "
                         "trainer's Python, so the trainer dies loading the model.")  # fmt: skip
    assert "to sdpa" in f.fix and "install a flash-attn built for this torch" in f.fix
    assert trainside.check_attention("flash_attention_2", flash_attn=True)[0].status == OK
    assert trainside.check_attention("sdpa", flash_attn=False)[0].status == OK
    assert "sdpa (set by rftstack train)" in trainside.check_attention(None, flash_attn=False)[0].message


def test_doctor_fails_an_unpad_that_needs_flash_attn():
    versions = {"verl": "0.8.0", "numpy": "2.3.5", "unpad_error": "ModuleNotFoundError: No module named 'flash_attn'"}
    ok, unpad = trainside.check_trainer_import(True, "", versions)
    assert ok.status == OK and unpad.status == FAIL and unpad.check == "train.unpad"
    assert "(ModuleNotFoundError: No module named 'flash_attn'), so the first training step fails." in unpad.message
    assert unpad.fix.startswith("Run `rftstack relax`")
    assert [f.check for f in trainside.check_trainer_import(True, "", {**versions, "unpad_error": ""})] == ["train.trainer_import"]


def test_flash_attn_is_not_in_this_environment():
    """The lock has no flash-attn; when it gains one, the default above changes meaning."""
    assert trainside.flash_attn_imports() is False


VERL_MODEL = r"""
import json, sys
from trinity.common.config import load_config
from trinity.trainer.verl.config import build_verl_config, FROZEN_KEYS
from verl.utils.config import omega_conf_to_dataclass
from transformers import AutoModelForCausalLM
cfg = load_config(sys.argv[1])
cfg.check_and_update()
v = build_verl_config(cfg)
out = {"frozen": sorted(k for k in FROZEN_KEYS if "override_config" in k or "attn" in k),
       "model_override": dict(v.model.override_config), "actor_has_model": "model" in v.actor, "ref_has_model": "model" in v.ref}
mc = omega_conf_to_dataclass(v.model)  # what verl's ActorRolloutRefWorker builds; the ref gets a deepcopy of it
out["hf_attn"] = mc.hf_config._attn_implementation
try:  # as Trinity's FSDP _build_module (trinity/trainer/verl/monkey_patch.py) loads the actor and the ref
    m = AutoModelForCausalLM.from_pretrained(mc.local_path, config=mc.hf_config, trust_remote_code=mc.trust_remote_code)
    out["loaded"] = m.config._attn_implementation
except ImportError as e:
    out["loaded"] = "ImportError: " + str(e)
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize("flash_attn", [False, True], ids=["changed", "unchanged"])
def test_verl_builds_and_loads_the_model_with_sdpa(tmp_path, tiny_model, flash_attn):
    """flash_attn=True writes the config as it was before the change (this machine has no flash_attn)."""
    cfg, _ = train_config.effective(base(str(tiny_model), str(tmp_path / "ckpt")), ray_address="127.0.0.1:2", flash_attn=flash_attn)
    (tmp_path / "ckpt/p/n/buffer").mkdir(parents=True)  # the serve started first
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(cfg))
    out = run_python(VERL_MODEL, str(tmp_path / "train.yaml"), timeout=600)
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    got = json.loads(lines[0][7:])
    assert got["frozen"] == []  # Trinity does not ignore the override
    assert not got["actor_has_model"] and not got["ref_has_model"]  # both read verl's one `model` section
    if flash_attn:
        assert got["model_override"] == {} and got["hf_attn"] == "flash_attention_2"
        assert got["loaded"].startswith("ImportError: FlashAttention2 has been toggled on, but it cannot be used")
    else:
        assert got["model_override"] == {"attn_implementation": "sdpa"}
        assert got["hf_attn"] == got["loaded"] == "sdpa"


UNPAD = r"""
import json, sys, types
import torch
from tensordict import TensorDict
from trinity.trainer.verl.monkey_patch import left_right_2_no_padding
import verl.utils.attention_utils as au
sys.path.insert(0, sys.argv[1])
from rftstack.stack import patches
out = {}
# as published: the module's text with the policy patch reversed, in a fresh module
text = open(au.__file__).read()
published = patches.undo(text, patches.patches_dir() / "verl-unpad-without-flash-attn.patch", "verl/utils/attention_utils.py")
pub = types.ModuleType("published_attention_utils")
exec(compile(published, "published_attention_utils.py", "exec"), pub.__dict__)
try:
    pub.unpad_input(torch.ones(1, 2, 1), torch.ones(1, 2, dtype=torch.int32))
    out["published"] = "ok"
except ImportError as e:
    out["published"] = f"{type(e).__name__}: {e}"
out["patched_text"] = "rftstack patch" in text
# installed (patched): Trinity's trainer step's unpadding on a left-right padded batch
mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
ids = torch.tensor([[0, 11, 12, 13, 0], [21, 22, 23, 24, 25]])
td = TensorDict({"input_ids": ids, "attention_mask": mask, "response_mask": mask[:, 3:], "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
                batch_size=[2])
td = left_right_2_no_padding(td)
out["tokens"] = [t.tolist() for t in td["input_ids"].unbind()]
out["positions"] = [t.tolist() for t in td["position_ids"].unbind()]
print("RESULT " + json.dumps(out))
"""


def test_trinity_unpads_a_batch_without_flash_attn():
    """Guards upstream behaviour: Trinity's trainer calls left_right_2_no_padding on every batch;
    verl's unpad_input as published needs flash_attn (fails here), with
    patches/verl-unpad-without-flash-attn.patch (applied by `rftstack relax`) it uses verl's
    pure-torch copy and the batch unpads to the tokens the mask keeps."""
    from helpers import PYTHON_DIR

    out = run_python(UNPAD, str(PYTHON_DIR), timeout=300)
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    got = json.loads(lines[0][7:])
    assert got["published"] == "ModuleNotFoundError: No module named 'flash_attn'"
    assert got["patched_text"] is True, "run `rftstack relax`"
    assert got["tokens"] == [[11, 12, 13], [21, 22, 23, 24, 25]]
    assert got["positions"] == [[0, 1, 2], [0, 1, 2, 3, 4]]


CRITIC = r"""
import inspect, json
from trinity.algorithm import ALGORITHM_TYPE
from trinity.trainer.verl.monkey_patch import load_valuehead_model
src = inspect.getsource(load_valuehead_model)
print("RESULT " + json.dumps({"hard_coded": src.count('attn_implementation="flash_attention_2"'),
      "critic": {a: ALGORITHM_TYPE.get(a).use_critic for a in ("reinforceplusplus", "ppo")}}))
"""


def test_only_a_critic_hard_codes_flash_attention_2():
    """Guards upstream behaviour: Trinity's value-model loader (the critic's) passes
    flash_attention_2 itself, which no config reaches; the train configs' algorithm has no critic."""
    out = run_python(CRITIC, timeout=300)
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    got = json.loads(lines[0][7:])
    assert got["hard_coded"] == 4 and got["critic"] == {"reinforceplusplus": False, "ppo": True}
    assert train_config.ALGORITHM == "reinforceplusplus"
