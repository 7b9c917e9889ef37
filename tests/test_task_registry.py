"""A task name is registered once: a second registration from another place (another task file, or a file shadowing a
built-in task) is refused in one line naming both places; the same registration run again replaces its own."""
import pytest

from cory.errors import ConfigError
from cory.tasks import registry
from cory.tasks.registry import load_task_file, register_task


@pytest.fixture(autouse=True)
def _registry_put_back(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


def _make(cfg, tokenizer, seed):  # never called here
    raise AssertionError


def test_a_task_file_shadowing_a_built_in_task_is_refused_naming_both_places(tmp_path):
    shadow = tmp_path / "shadow.py"
    shadow.write_text("from cory.tasks import register_task\n\nregister_task('imdb', lambda cfg, tok, seed: None)\n")
    with pytest.raises(ConfigError) as e:
        load_task_file(shadow)
    text = str(e.value)
    assert "\n" not in text and "'imdb' is registered twice" in text
    assert "cory/tasks/imdb.py:" in text and f"{shadow}:3" in text


def test_two_places_registering_one_name_are_refused_and_the_same_place_again_is_not(tmp_path):
    first = tmp_path / "first.py"
    first.write_text("from cory.tasks import register_task\n\nregister_task('mine', lambda cfg, tok, seed: 1)\n")
    load_task_file(first)
    load_task_file(first)  # the same file run again (a script that also loads itself as a task file)
    second = tmp_path / "second.py"
    second.write_text("from cory.tasks import register_task\nregister_task('mine', lambda cfg, tok, seed: 2)\n")
    with pytest.raises(ConfigError, match=r"'mine' is registered twice: at .*first\.py:3 and at .*second\.py:2"):
        load_task_file(second)
    assert registry.task_spec("mine").make(None, None, 0) == 1  # the first stays


def test_in_code_a_second_registration_elsewhere_is_refused():
    register_task("mine_in_code", _make)
    with pytest.raises(ConfigError, match="registered twice"):
        register_task("mine_in_code", _make)  # another line of this file: another place


def test_a_task_file_run_as_a_script_that_shadows_a_built_in_is_one_line(tmp_path):
    """Run as a script, a task file registers before its cli.main() could catch anything: still one line, exit 2."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    shadow = tmp_path / "shadow.py"
    shadow.write_text("from cory.tasks import register_task\n\nregister_task('imdb', lambda cfg, tok, seed: None)\n")
    p = subprocess.run([sys.executable, str(shadow)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
    assert lines[0].startswith("error: task 'imdb' is registered twice: at ") and f"{shadow}:3" in lines[0]
