# make demo : create .venv, install everything, run CORY on the embedded model (CPU, offline)
# make test : create .venv, install everything, run the default test suite (unit tests and one end-to-end run per
#             training script and lab command; the tests marked slow are left out) on 2 pytest-xdist workers
# make test-slow : the slow set: the other end-to-end runs, resume, signal and fault runs (CI runs both); one
#                  process, as before: its timing-sensitive runs (signals, two writers) are not yet shown to be
#                  safe beside a second worker
# TEST_WORKERS=N : run make test on N workers (default 2, what a 2-core laptop has; each worker holds torch and
#                  its models, and the runs it starts share its cores: tests/conftest.py); make test hands out
#                  whole files (--dist loadfile), so a file's fixtures (models, runs) are built once
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTHON ?= $(shell command -v python3.11 || command -v python3)
TEST_WORKERS ?= 2

.PHONY: install demo test test-slow clean

$(STAMP): requirements.txt requirements-assets.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-assets.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(PY) imdb_train/cory.py --config configs/imdb/cory_cpu.yaml --steps 4 --swap_period 2 --batch_size 16 \
		--eval_every 0 --output_dir runs/demo --overwrite
	@echo "samples (query, pioneer and observer answers, rewards): runs/demo/samples.jsonl"

test: install
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --durations=20

test-slow: install
	$(PY) -m pytest -q -m slow --durations=20

# what the Makefile made: the venv and the tools' caches; runs/ holds users' runs (the scripts' default output
# folder) and is not make's to delete: remove a run yourself with rm -r runs/NAME
clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .hypothesis
