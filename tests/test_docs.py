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


def _anchors(md: Path) -> set[str]:
    """The anchors GitHub gives ``md``'s headings: lower case, punctuation but ``-`` and ``_`` dropped, spaces as
    ``-``, a repeated one suffixed -1, -2, ..."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#+ (.+)$", md.read_text(), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        anchors.add(slug if seen[slug] == 0 else f"{slug}-{seen[slug]}")
    return anchors


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_into_a_section_find_its_heading(doc):
    """A link to ``some.md#section`` (or ``#section`` in the same file) lands on a heading of that file: a section
    renamed or cut (benchmarks/README.md became a manual) must take its links along."""
    broken = []
    for path, anchor in re.findall(r"\]\(([^)\s#]*)#([^)\s]+)\)", doc.read_text()):
        if re.match(r"[a-z]+:", path) or not (path == "" or path.endswith(".md")):
            continue
        if anchor not in _anchors(doc.parent / path if path else doc):
            broken.append(f"{path}#{anchor}")
    assert not broken, f"{doc.name}: {broken}"


def test_the_benchmarks_readme_is_a_manual_not_a_notebook():
    """benchmarks/README.md says what each benchmark measures, how to run it and the targets' state; history stays in
    git and raw figures in benchmarks/data/ (issue 61), so the file stays short."""
    size = len((ROOT / "benchmarks" / "README.md").read_bytes())
    assert size <= 15 * 1024, f"benchmarks/README.md is {size} bytes; at most 15 KB"
    text = (ROOT / "benchmarks" / "README.md").read_text()
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        if script.name not in ("harness.py", "iteration_worker.py"):
            assert f"python benchmarks/{script.name}" in text, f"no command for benchmarks/{script.name}"


def test_no_qa_logs_among_the_user_docs():
    assert not [p.name for p in (ROOT / "docs").glob("qa_*")], "QA logs belong in git history, not docs/"
