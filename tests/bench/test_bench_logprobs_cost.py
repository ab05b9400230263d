"""bench/logprobs_cost.py: vLLM's own code for the logprobs and token ids of one chat answer, timed on the CPU
(the engine's sampled ids and logprobs are a TEST DOUBLE; the tokenizer is the bench model's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "logprobs_cost.py"


def test_the_fields_add_vllms_logprobs_stages_and_bytes(tmp_path):
    """With the proxy's fields every stage of vLLM's logprobs path runs and the answer carries one logprobs
    entry per token (several times the bytes); plain, only the response is built."""
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--responses", "5", "--tokens", "16", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    plain, fields = res["ms_per_response_median"]["plain"], res["ms_per_response_median"]["with the proxy's fields"]
    assert set(plain) == {"response (model_dump + json)", "total", "response_bytes"}
    assert {"output processor", "chat logprobs", "response (model_dump + json)"} <= set(fields)
    assert fields["total"] > plain["total"] > 0 and res["added_ms_per_response"] > 0
    assert fields["response_bytes"] > 3 * plain["response_bytes"]
    assert res["vocab"] == 382 and res["tokens"] == 16
    # numeric logprobs (the venv carries the policy's patches): no chat logprobs stage, the floats in the answer
    numeric = res["ms_per_response_median"]["with the proxy's fields, numeric logprobs"]
    assert set(numeric) == {"output processor", "response (model_dump + json)", "total", "response_bytes"}
    # the token ids stay; each token's logprob is a number, not an object of about 100 bytes
    assert plain["response_bytes"] < numeric["response_bytes"] < fields["response_bytes"] - 40 * 16
    assert res["added_ms_per_response_numeric"] == pytest.approx(numeric["total"] - plain["total"], abs=1e-3)


@pytest.mark.parametrize("argv, says", [(["--tokens", "0"], "must be positive"),
                                        (["--tokenizer", "/no/such/dir"], "is not a directory")])
def test_bad_input_is_one_sentence(argv, says):
    r = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1
