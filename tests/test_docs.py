"""The user docs: README's first screen says what CORY is, where the method lives, the two commands and the answers;
every relative link in the docs resolves."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "results" / "README.md", ROOT / "benchmarks" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_first_screen_holds_the_method_the_commands_and_the_answers():
    readme = (ROOT / "README.md").read_bytes()
    assert len(readme) <= 12 * 1024, f"README.md is {len(readme)} bytes; the first screen must stay short"
    first = "\n".join(readme.decode().splitlines()[:30])
    for needed in ("cory/game.py", "cory/ppo.py", "make demo", "make test", "results/README.md"):
        assert needed in first, needed
    answers = _answer_rows()
    assert 1 <= len(answers) <= 8 and all(row in first for row in answers), "the answers' table on the first screen"
    assert all("](results/" in row for row in answers), "each answer links its folder"


def _answer_rows() -> list[str]:
    """The rows of README's table of answers (question | answer | power | folder), header left out."""
    text = (ROOT / "README.md").read_text().split("## The answers so far", 1)[1].lstrip().split("\n", 1)[1]
    table = text.strip().split("\n\n", 1)[0].splitlines()  # the block under the heading
    return table[2:] if table and table[0].startswith("| question | answer | power | folder |") else []


def test_the_readmes_answers_are_numbers_of_the_files_they_link():
    """Every decimal number in an answer or its power is a number of a file its row links, as rounded there: the
    answers are kept in the reports, and README cannot drift from them (as a seed count once did)."""
    for row in _answer_rows():
        linked = " ".join((ROOT / target).read_text() for target in re.findall(r"\]\((results/[^)#]+)\)", row))
        theirs = [float(x) for x in re.findall(r"\d+\.\d+", linked)]
        answer_and_power = " ".join(row.split(" | ")[1:3])
        for number in re.findall(r"\d+\.\d+", answer_and_power):
            half_unit = 0.5 * 10 ** -len(number.split(".")[1]) + 1e-12
            assert any(abs(x - float(number)) <= half_unit for x in theirs), (number, row[:70])


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        path = target.split("#")[0]
        if not path or re.match(r"[a-z]+:", path):
            continue
        if not (doc.parent / path).exists():
            broken.append(target)
    assert not broken, f"{doc.name}: {broken}"


def test_no_qa_logs_among_the_user_docs():
    assert not [p.name for p in (ROOT / "docs").glob("qa_*")], "QA logs belong in git history, not docs/"
