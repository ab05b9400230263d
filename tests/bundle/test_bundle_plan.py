"""bundle_plan: what goes into a bundle, decided from the real uv.lock."""

from __future__ import annotations

import pytest
from bundle_helpers import REAL_LOCK

from rftstack.bundle import plan as bp
from rftstack.stack import lockfile
from rftstack.errors import UserError

GPU_FREEZE = """# pip freeze of a host (comment line)
torch==2.11.0+cu130
numpy==2.1.0
six==1.17.0
-e git+https://example.invalid/x#egg=x
somepkg @ file:///tmp/somepkg.whl
"""


@pytest.fixture(scope="module")
def lock():
    return lockfile.load(REAL_LOCK)


T312 = bp.Target("3.12", "manylinux_2_31_x86_64")


def by_name(items):
    return {i.name: i for i in items}


def test_plan_for_cp312_picks_cp312_wheels_and_the_root_project(lock):
    items = by_name(bp.plan(lock, T312))
    assert items["rftstack"].kind == bp.PROJECT
    assert items["numpy"].artifact.filename.startswith("numpy-2.3.5-cp312-cp312-")
    assert "cp312" in items["torch"].artifact.filename
    # extras are followed: vllm comes in through trinity-rft[vllm], ray's [default] extra brings aiohttp
    assert {"vllm", "trinity-rft", "verl", "aiohttp", "greenlet"} <= set(items)
    # markers are evaluated for the target: networkx 3.7 on 3.12, 3.6.1 on 3.11
    assert items["networkx"].version == "3.7"
    assert by_name(bp.plan(lock, bp.Target("3.11", "manylinux_2_31_x86_64")))["networkx"].version == "3.6.1"
    # dev dependencies are not part of the stack
    assert "pytest" not in items


def test_sdist_only_packages_are_marked_for_a_build(lock):
    items = by_name(bp.plan(lock, T312))
    assert items["antlr4-python3-runtime"].kind == bp.SDIST
    assert items["word2number"].kind == bp.SDIST
    assert items["word2number"].artifact.filename == "word2number-1.1.zip"


def test_best_tag_wins_among_several_wheels(lock):
    crypto = by_name(bp.plan(lock, bp.Target("3.12", "manylinux_2_35_x86_64")))["cryptography"]
    assert "manylinux_2_34" in crypto.artifact.filename  # newer glibc: the 2_34 build
    crypto = by_name(bp.plan(lock, T312))["cryptography"]
    assert "manylinux_2_28" in crypto.artifact.filename


def test_no_wheel_for_the_target_names_package_and_target(lock):
    with pytest.raises(UserError, match=r"no wheel for CPython 3.12 on manylinux_2_28_x86_64 of llguidance 1.7.6"):
        bp.plan(lock, bp.Target("3.12", "manylinux_2_28_x86_64"))
    # excluding it (or having it on the target) makes the plan possible
    items = by_name(bp.plan(lock, bp.Target("3.12", "manylinux_2_28_x86_64"), exclude=["llguidance"]))
    assert items["llguidance"].status == bp.EXCLUDED


def test_have_skips_same_versions_only(lock):
    have = bp.parse_freeze(GPU_FREEZE)
    assert have == {"torch": "2.11.0+cu130", "numpy": "2.1.0", "six": "1.17.0"}
    items = by_name(bp.plan(lock, T312, have=have))
    assert items["torch"].status == bp.PRESENT  # +cu130 is PyPI's torch 2.11.0
    assert items["six"].status == bp.PRESENT
    assert items["numpy"].status == bp.SEND  # 2.1.0 on the host, 2.3.5 locked


def test_same_version():
    assert bp.same_version("2.11.0+cu130", "2.11.0")
    assert not bp.same_version("2.11.0", "2.11.0+cu128")
    assert not bp.same_version("2.1.0", "2.3.5")


def test_optional_gpu_preset_is_data_and_matches_prefixes(lock):
    preset = bp.load_presets()["optional-gpu"]
    assert "nvidia-cutlass-dsl*" in preset["packages"] and preset["why"]
    items = by_name(bp.plan(lock, T312, exclude=preset["packages"]))
    excluded = {n for n, i in items.items() if i.status == bp.EXCLUDED}
    assert {"flashinfer-cubin", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base", "streamlit"} <= excluded
    assert items["vllm"].status == bp.SEND and items["nvidia-cudnn-cu13"].status == bp.SEND
    assert bp.excluded_by("nvidia_cutlass_dsl_libs_cu13", ["nvidia-cutlass-dsl*"]) == "nvidia-cutlass-dsl*"
    assert bp.excluded_by("nvidia-cutlass", ["nvidia-cutlass-dsl*"]) is None


def test_platform_tags_include_older_glibc_and_legacy_aliases():
    tags = bp.platform_tags("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64"
    assert {"manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_31_x86_64" not in tags
    assert bp.platform_tags("manylinux2014_x86_64")[0] == "manylinux_2_17_x86_64"


def test_bad_target_is_one_sentence():
    with pytest.raises(UserError, match="--python"):
        bp.parse_target("twelve", "manylinux_2_28_x86_64")
    with pytest.raises(UserError, match="--platform 'win_amd64'"):
        bp.parse_target("3.12", "win_amd64")


def test_cuda12_flavour_plan_from_the_real_lock_and_policy():
    """--flavour cuda12: the policy's CUDA 12 builds replace torch/torchvision/torchaudio/vllm (URL
    and sha256 from policy.toml), the lock's cuda12 group comes in, no CUDA 13-only distribution is left."""
    from rftstack.stack import policy as _policy

    pol = _policy.load()
    lock = lockfile.load(REAL_LOCK)
    items = {i.name: i for i in bp.plan(lock, bp.parse_target("3.12", "manylinux_2_31_x86_64"), flavour="cuda12", pol=pol)}
    for a in pol.artifacts:
        i = items[a.name]
        assert (i.version, i.artifact.url, i.artifact.sha256) == (a.version, a.url, a.sha256)
    assert len([n for n in items if n.endswith("-cu12")]) == 15
    assert not [n for n in items if n.endswith("-cu13") or n in pol.drop_names()]
    assert "cuda-bindings" in items and "nvidia-ml-py" in items
    with pytest.raises(UserError, match="does not fit CPython 3.11"):
        bp.plan(lock, bp.parse_target("3.11", "manylinux_2_31_x86_64"), flavour="cuda12", pol=pol)
