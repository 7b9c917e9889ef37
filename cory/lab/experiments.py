"""Moved: the lab bench is the top-level package lab/ now."""
raise SystemExit("python -m cory.lab.experiments has moved: run python -m lab.experiments")
