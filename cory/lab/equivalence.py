"""Moved: the lab bench is the top-level package lab/ now."""
raise SystemExit("python -m cory.lab.equivalence has moved: run python -m lab.equivalence")
