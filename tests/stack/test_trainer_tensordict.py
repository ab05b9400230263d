"""The locked tensordict is one verl's trainer path accepts.

Guards upstream behaviour: verl 0.8.0's metadata allows tensordict >=0.8.0,<=0.10.0 (not 0.9.0),
but `DataProto.to_tensordict` (verl/protocol.py), which Trinity 0.6.0's verl trainer calls for the
reference log-probs of every step (`_compute_ref_log_prob`), asserts tensordict >= 0.10. With the
resolver's choice of 0.8.3 the first training step on the GPU host died there; the lock now pins
0.10.0 (pyproject.toml). Real packages: verl's own assert, read from its source, and a real
DataProto converted the way the trainer converts it.
"""

from __future__ import annotations

import inspect
import re

import tensordict
import torch
from packaging.version import Version
from verl.protocol import DataProto


def test_installed_tensordict_meets_verls_own_floor():
    src = inspect.getsource(DataProto.to_tensordict)
    floors = re.findall(r'parse_version\(tensordict\.__version__\)\s*>=\s*parse_version\("([\d.]+)"\)', src)
    assert floors, "verl's to_tensordict no longer checks the tensordict version; revisit the pin in pyproject.toml"
    assert Version(tensordict.__version__) >= Version(floors[0]), (tensordict.__version__, floors)


def test_a_batch_converts_as_the_trainer_converts_it():
    batch = DataProto.from_dict(
        tensors={"input_ids": torch.arange(6).view(2, 3), "attention_mask": torch.ones(2, 3, dtype=torch.long)},
        meta_info={"temperature": 1.0},
    )
    td = batch.to_tensordict()
    assert isinstance(td, tensordict.TensorDict)
    assert torch.equal(td["input_ids"], batch.batch["input_ids"]) and td.batch_size == torch.Size([2])
