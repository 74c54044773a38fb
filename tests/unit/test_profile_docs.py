"""docs/deploy.md's stub counts and GPU memory per stub come from the profiles."""

import re
from dataclasses import replace

import pytest

from phoenix.ops import profile_docs
from phoenix.ops.configs import REPOSITORY
from phoenix.ops.profile_docs import (
    ProfileDocError,
    device_stubs,
    overlay_mem_fraction,
    profile_block,
    stubs,
)
from phoenix.ops.profiles import CPU, GPU

STALE_DOC = (
    "# Deploy\n\nintro\n\n<!-- profile-table:start -->\n8 stubs\n<!-- profile-table:end -->\n\n"
    "rest\n"
)


def test_deploy_md_holds_the_block_the_profiles_give():
    """Fails when a profile or the GPU overlay changed and docs/deploy.md was not rewritten
    (`python -m phoenix.ops.profile_docs`)."""
    assert profile_docs.main(["--check"]) == 0


def configured_instances(repository) -> int:
    """Instances over the instance groups of the generated (CPU profile's) configs."""
    groups = (re.findall(r"instance_group \{\s*count: (\d+)", config.read_text())
              for config in repository.glob("*/config.pbtxt"))  # fmt: skip
    return sum(int(count) for found in groups for count in found)


def test_stubs_count_every_instance_and_the_gpu_only_its_own():
    assert stubs(CPU) == configured_instances(REPOSITORY) == 16  # what Triton starts
    assert stubs(GPU) == 13
    assert device_stubs(GPU) == 7  # the feed policy's, user state's and served log's: host
    assert device_stubs(CPU) == stubs(CPU)


def test_the_block_follows_a_profile_change():
    more_rankers = replace(
        GPU, models={**GPU.models, "ranker": replace(GPU.models["ranker"], instances=4)}
    )
    block = profile_block(CPU, more_rankers, 0.1)
    assert "| ranker | 2 | 4 (GPU) |" in block
    assert "| **per pod** | **16** | **15**, 9 of them on the GPU |" in block
    assert "9 stubs x 0.1 = 90% of the GPU" in block and "0.9 / 9 = 0.1" in block
    assert "| per GPU stub | 1.6 GiB | 2.4 GiB |" in block


def test_the_overlay_fraction_is_read_from_the_gpu_patch():
    assert overlay_mem_fraction() == 0.12


def test_a_patch_without_the_fraction_is_named(tmp_path):
    patch = tmp_path / "gpu.yaml"
    patch.write_text("spec:\n  template:\n    spec:\n      containers:\n        - name: triton\n")
    with pytest.raises(
        ProfileDocError, match=r"gpu\.yaml: expected one XLA_PYTHON_CLIENT_MEM_FRACTION, found 0"
    ):
        overlay_mem_fraction(patch)


def test_check_fails_on_a_stale_block_and_the_writer_fixes_it(tmp_path, capsys):
    doc = tmp_path / "deploy.md"
    doc.write_text(STALE_DOC)
    assert profile_docs.main(["--doc", str(doc), "--check"]) == 1
    assert doc.read_text() == STALE_DOC
    assert "out of date" in capsys.readouterr().err
    assert profile_docs.main(["--doc", str(doc)]) == 0
    text = doc.read_text()
    assert "8 stubs" not in text and "| **per pod** | **16** |" in text
    assert text.startswith("# Deploy\n\nintro\n\n<!-- profile-table:start -->\n")
    assert text.endswith("<!-- profile-table:end -->\n\nrest\n")
    assert profile_docs.main(["--doc", str(doc), "--check"]) == 0


def test_a_doc_without_markers_is_an_error_naming_it(tmp_path, capsys):
    doc = tmp_path / "deploy.md"
    doc.write_text("# Deploy\n")
    assert profile_docs.main(["--doc", str(doc)]) == 2
    assert "deploy.md: expected one <!-- profile-table:start -->" in capsys.readouterr().err
