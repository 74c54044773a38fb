"""docs/reference.md and the README's model table are written from the contracts, the
profiles and the stubs' metric families (phoenix/ops/reference_docs.py)."""

from dataclasses import replace

import pytest

from phoenix.ops import reference_docs
from phoenix.ops.profiles import CPU, GPU
from phoenix.ops.reference_docs import (
    markers,
    models_block,
    readme_block,
    stages_block,
)
from phoenix.ops.reference_metrics import ReferenceDocError, metrics_block
from phoenix.schema.served import CONTRACTS
from phoenix.stub import request_metrics


def doc_with(*names: str, title: str = "# Doc") -> str:
    blocks = "".join(f"{markers(n)[0]}\nstale {n}\n{markers(n)[1]}\n\n" for n in names)
    return f"{title}\n\nintro\n\n{blocks}rest\n"


def test_the_committed_reference_and_readme_are_up_to_date():
    """Fails when a contract, a profile or a metric family changed and the docs were not
    rewritten (`python -m phoenix.ops.reference_docs`, `make configs`)."""
    assert reference_docs.main(["--check"]) == 0


def test_every_served_model_has_a_section_with_its_inputs_outputs_and_parameters():
    block = models_block()
    for name, contract in CONTRACTS.items():
        section = block.split(f"### `{name}`\n")[1].split("\n### ")[0]
        for spec in (*contract.inputs, *contract.outputs):
            assert f"| `{spec.name}` | {spec.triton_dtype} |" in section, (name, spec.name)
        if not contract.stages:
            for p in contract.parameters:
                assert f"| `{p.name}` | {p.kind} |" in section, (name, p.name)
    ranker = block.split("### `ranker`\n")[1].split("\n### ")[0]
    assert "cpu 8 (buckets 1, 2, 4, 8); gpu 64 (buckets 1, 8, 64)" in ranker
    assert "| `candidate_post_ids` | INT64 | `[R, C]` | ragged | ids in" not in ranker
    assert "| `candidate_post_ids` | INT64 | `[R, C]` | ragged | ids >= 1 |" in ranker
    assert "| `candidate_buckets` | ints | 16,64,256,512,1024 |  | gpu: 64,256,1024 |" in ranker


def test_the_tables_follow_a_profile_change():
    more = replace(GPU, models={**GPU.models, "ranker": replace(GPU.models["ranker"],
                                                                  max_batch_size=32)})  # fmt: skip
    assert "gpu 32 (buckets 1, 8, 64)" in models_block((CPU, more))
    assert "| 8 / 32 |" in readme_block((CPU, more)).split("[`ranker`]")[1].split("\n")[0]


def test_the_stages_are_recommend_chains_in_order():
    rows = [line for line in stages_block().splitlines() if line.startswith("| ") and "[`" in line]
    stages = [row.split("[`")[1].split("`]")[0] for row in rows]
    assert stages == ["user_state", "user_encoder", "retriever", "ranker", "feed_policy",
                      "served_log"]  # fmt: skip
    assert "`excluded_post_ids` <- `_served_post_ids`" in rows[2]
    assert "(side effect)" in rows[5] and "(side effect)" not in "".join(rows[:5])


def test_every_metric_family_is_listed_with_the_models_that_export_it():
    block = metrics_block()
    for family in request_metrics.OWN_METRICS:
        assert f"| `{family}` |" in block
    dropped = next(line for line in block.splitlines() if request_metrics.DROPPED in line)
    assert dropped.endswith("| `feed_policy`, `recommend_chain` |")
    assert "filter" in dropped and "`too_old`" in dropped


def test_a_metric_family_without_a_meaning_is_an_error(monkeypatch):
    monkeypatch.setattr(request_metrics, "OWN_METRICS", (*request_metrics.OWN_METRICS, "x_new"))
    with pytest.raises(ReferenceDocError, match="'x_new' has no meaning"):
        metrics_block()


def test_a_served_model_without_a_role_is_an_error(monkeypatch):
    monkeypatch.delitem(reference_docs.ROLES, "ranker")
    with pytest.raises(ReferenceDocError, match="'ranker' has no role"):
        readme_block()


def test_check_fails_on_a_stale_block_and_the_writer_fixes_it(tmp_path, capsys):
    reference, readme = tmp_path / "reference.md", tmp_path / "README.md"
    reference.write_text(doc_with("models", "stages", "limits", "metrics"))
    readme.write_text(doc_with("models", title="# Readme"))
    paths = ["--reference", str(reference), "--readme", str(readme)]
    stale = reference.read_text(), readme.read_text()
    assert reference_docs.main([*paths, "--check"]) == 1
    assert (reference.read_text(), readme.read_text()) == stale
    assert "out of date" in capsys.readouterr().err
    assert reference_docs.main(paths) == 0
    text = reference.read_text()
    assert "stale" not in text and "### `recommend_chain`" in text
    assert "| `max_rows` | 4,096 |" in text
    assert text.startswith("# Doc\n\nintro\n\n<!-- reference:models:start -->\n")
    assert text.endswith("<!-- reference:metrics:end -->\n\nrest\n")
    assert "[`ranker`](docs/reference.md#ranker)" in readme.read_text()
    assert reference_docs.main([*paths, "--check"]) == 0


def test_a_doc_without_a_blocks_markers_is_an_error_naming_it(tmp_path, capsys):
    reference, readme = tmp_path / "reference.md", tmp_path / "README.md"
    reference.write_text(doc_with("models", "stages", "limits"))  # no metrics block
    readme.write_text(doc_with("models"))
    assert reference_docs.main(["--reference", str(reference), "--readme", str(readme)]) == 2
    assert "reference.md: expected one <!-- reference:metrics:start -->" in capsys.readouterr().err
