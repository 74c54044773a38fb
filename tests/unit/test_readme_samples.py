"""The README's samples are there, and the comparison the integration tests make between a
sample and a command's output (tests/readme_samples.py) tells them apart when they differ.
The samples themselves run against real servers: tests/integration/test_clients.py (`make
demo`'s output) and tests/integration/test_recommend_by_id.py (the tritonclient call)."""

import pytest

from tests.readme_samples import chunks, fenced_lines, readme_block, unmatched

OUTPUT = """\
tritonserver 123 ready after 9.7 s

Demo user 7, 16 history items:
  history topics:   sports 9, pets 4

rank  topic      author             score   retr.  top actions
   1  sports     @sports_10         3.962   0.728  dwell 0.79, favorite 0.69
   2  sports     @sports_4         -0.436   0.741  dwell 0.74, favorite 0.63
   3  gaming     @sports_12        13.420   0.759  dwell 0.78, favorite 0.66
... 30 more
  topics of the top 20: sports 17, gaming 1
""".splitlines()

SAMPLE = """\
Demo user 4387660609983306520, 16 history items:
  history topics:   sports 1, pets 2
...
rank  topic      author             score   retr.  top actions
   1  sports     @sports_10         5.258   0.728  dwell 0.79, favorite 0.69
   2  sports     @sports_4          4.575   0.741  dwell 0.75, favorite 0.63
...
  topics of the top 20: sports 17, gaming 1
""".splitlines()


def test_a_sample_matches_whatever_its_numbers_and_spacing():
    assert chunks(SAMPLE)[1][0].startswith("rank")
    assert unmatched(SAMPLE, OUTPUT) is None


@pytest.mark.parametrize(
    "change",
    [
        lambda s: [line.replace("score", "scores") for line in s],  # another header
        lambda s: [line.replace("@sports_4 ", "@pets_4 ") for line in s],  # another author
        lambda s: [line for line in s if "1  sports" not in line],  # a row left out
        lambda s: s[3:] + s[:3],  # the same runs in another order
        lambda s: [*s, "  after the feed policy: at most 1 of the top 10 posts"],  # a line more
    ],
)
def test_a_sample_the_output_does_not_show_is_caught(change):
    assert unmatched(change(SAMPLE), OUTPUT) is not None


def test_the_readme_holds_both_samples():
    demo = fenced_lines(readme_block("demo-output"))
    assert any(line.startswith("rank  topic") for line in demo)
    assert len(chunks(demo)) >= 2
    code = "\n".join(fenced_lines(readme_block("call-example")))
    compile(code, "README.md", "exec")  # valid Python
    assert "tritonclient" in code and '"recommend"' in code and "127.0.0.1:8000" in code
