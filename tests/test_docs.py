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
    answers = [line for line in first.splitlines() if line.startswith("- **")]
    assert 1 <= len(answers) <= 6
    assert all("](results/" in line for line in answers), "each answer links its folder"


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
