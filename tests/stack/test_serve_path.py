"""The report's problems 4 and 5, and the imports of Trinity's serve path, on the real locked stack.

Each check runs in a fresh interpreter so the heavy imports (vllm, trinity) stay out of pytest.
"""

from __future__ import annotations

import json

from helpers import run_python, write_report_config


def test_report_config_validates_and_becomes_checkpoint(report_config):
    """Problem 4, part 1: Trinity's own validation turns sync_method nccl into checkpoint in serve mode."""
    r = run_python(
        """
        import json, sys
        from trinity.common.config import load_config
        c = load_config(sys.argv[1])
        before = c.synchronizer.sync_method.value
        c.check_and_update()
        print(json.dumps({"before": before, "after": c.synchronizer.sync_method.value,
                          "openai": c.explorer.rollout_model.enable_openai_api, "mode": c.mode}))
        """,
        str(report_config),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"before": "nccl", "after": "checkpoint", "openai": True, "mode": "serve"}


def test_report_config_without_max_model_len_is_refused(tmp_path, tiny_model):
    """The report's config as written has no model.max_model_len, and Trinity refuses it (doctor catches this)."""
    cfg = write_report_config(tmp_path / "qwen3b.yaml", tiny_model, max_model_len=None)
    r = run_python(
        """
        import sys
        from trinity.common.config import load_config
        load_config(sys.argv[1]).check_and_update()
        """,
        str(cfg),
    )
    assert r.returncode != 0
    assert "max_model_len" in r.stderr


def test_checkpoint_backend_validates_in_locked_vllm():
    """Problem 4, part 2: vllm's WeightTransferConfig accepts the backend Trinity passes in serve mode."""
    r = run_python(
        """
        from vllm.config import WeightTransferConfig
        print(WeightTransferConfig(backend="checkpoint").backend)
        """
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "checkpoint"


def test_vllm_extension_imports_pack_tensors():
    """Problem 5: trinity's vllm_extension imports pack_tensors/unpack_tensor from the locked vllm."""
    r = run_python(
        """
        import trinity.common.models.vllm_extension as ext
        from vllm.distributed.weight_transfer.packed_tensor import pack_tensors, unpack_tensor
        print(ext.pack_tensors is pack_tensors, ext.unpack_tensor is unpack_tensor)
        """
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "True True"


SERVE_PATH_MODULES = [
    "trinity.cli.launcher",
    "trinity.explorer.explorer",
    "trinity.explorer.proxy.app",
    "trinity.explorer.proxy.service",
    "trinity.explorer.proxy.recorder",
    "trinity.explorer.rollout_coordinator",
    "trinity.common.models.vllm_model",
    "trinity.common.models.vllm_worker",
    "trinity.buffer.storage.sql",
    "trinity.buffer.schema.sql_schema",
    "trinity.manager.synchronizer",
]


def test_serve_path_modules_import():
    r = run_python(
        """
        import importlib, sys
        for m in sys.argv[1:]:
            importlib.import_module(m)
        print("ok", len(sys.argv) - 1)
        """,
        *SERVE_PATH_MODULES,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == f"ok {len(SERVE_PATH_MODULES)}"


def test_sql_recorder_async_engine_round_trip(tmp_path):
    """The proxy's SQL recorder path: an async SQLAlchemy engine on sqlite (needs greenlet) writes and reads."""
    db = tmp_path / "proxy_history.db"
    r = run_python(
        """
        import asyncio, sys
        from sqlalchemy import text
        from sqlalchemy.ext.asyncio import create_async_engine
        async def main(url):
            engine = create_async_engine(url)
            async with engine.begin() as conn:
                await conn.execute(text("create table t (x integer)"))
                await conn.execute(text("insert into t values (41), (1)"))
            async with engine.connect() as conn:
                print((await conn.execute(text("select sum(x) from t"))).scalar())
            await engine.dispose()
        asyncio.run(main(sys.argv[1]))
        """,
        f"sqlite+aiosqlite:///{db}",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "42"
    assert db.stat().st_size > 0
