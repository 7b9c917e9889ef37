"""The size limits the code is kept to: no Python file in `cory/`, `lab/` or `benchmarks/` over 600 lines, and no
function or method there over 80 (from its `def` line to its last; decorators not counted), so that a file reads as
one concern and a function as one step. Read from the syntax tree; each file or function over its limit is named
with its size, to be split where it grew. And no backslash line continuation (parentheses instead, as PEP 8
prefers): a reader of the code's tokens, the structure's review among them, loses its way after one."""
import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("cory", "lab", "benchmarks")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def _files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def long_files(paths: list[Path]) -> list[str]:
    """``path (N lines)`` for each file over MAX_FILE_LINES lines."""
    sizes = {path: len(path.read_text(encoding="utf-8").splitlines()) for path in paths}
    return [f"{_name(path)} ({n} lines)" for path, n in sizes.items() if n > MAX_FILE_LINES]


def long_functions(paths: list[Path]) -> list[str]:
    """``path:line name (N lines)`` for each function or method over MAX_FUNCTION_LINES lines, nested ones too."""
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append(f"{_name(path)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_file_is_over_600_lines():
    paths = _files()
    for folder in FOLDERS:  # a folder moved away must not leave the check reading nothing
        assert any(p.is_relative_to(ROOT / folder) for p in paths), f"no Python file under {folder}/"
    over = long_files(paths)
    assert not over, f"over {MAX_FILE_LINES} lines (split by concern): " + "; ".join(over)


def test_no_function_is_over_80_lines():
    over = long_functions(_files())
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines (split into named steps): " + "; ".join(over)


def _function(name: str, lines: int, indent: str = "") -> str:
    """A function of exactly ``lines`` lines."""
    body = [f"{indent}    x{i} = {i}" for i in range(lines - 2)]
    return "\n".join([f"{indent}def {name}():", *body, f"{indent}    return 0"]) + "\n"


def test_the_check_names_each_file_and_function_over_the_limits(tmp_path):
    at_limits = tmp_path / "at_limits.py"
    at_limits.write_text(_function("fits", 80) + "\n" * (600 - 80))
    over = tmp_path / "over.py"
    over.write_text("class C:\n" + _function("grown", 81, indent="    ") + "\n" * (600 - 82 + 1))
    assert [len(p.read_text().splitlines()) for p in (at_limits, over)] == [600, 601]
    assert long_files([at_limits, over]) == [f"{over} (601 lines)"]
    assert long_functions([at_limits, over]) == [f"{over}:2 grown (81 lines)"]


def backslash_continuations(paths: list[Path]) -> list[str]:
    """``path:line`` for each line of code continued by a backslash (a backslash inside a string is not one)."""
    out = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        in_strings = set()
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING or tok.type in _FSTRING_PARTS:
                in_strings.update(range(tok.start[0], tok.end[0]))
        lines = text.splitlines()
        out += [f"{_name(path)}:{i}" for i, line in enumerate(lines, 1)
                if line.rstrip().endswith("\\") and i not in in_strings and not line.lstrip().startswith("#")]
    return out


_FSTRING_PARTS = {getattr(tokenize, n) for n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END") if hasattr(tokenize, n)}


def test_no_line_is_continued_by_a_backslash():
    found = backslash_continuations(_files())
    assert not found, "a backslash line continuation (use parentheses): " + "; ".join(found)


def test_the_check_finds_a_backslash_continuation_and_passes_one_in_a_string(tmp_path):
    code = tmp_path / "code.py"
    code.write_text('DOC = """a docstring that shows a command \\\n    --flag"""\n'
                    "x = 1 + \\\n    2\n")
    assert backslash_continuations([code]) == [f"{code}:3"]
