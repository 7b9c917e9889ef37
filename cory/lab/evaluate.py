"""Moved: the lab bench is the top-level package lab/ now."""
raise SystemExit("python -m cory.lab.evaluate has moved: run python -m lab.evaluate")
