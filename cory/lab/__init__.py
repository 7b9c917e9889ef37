"""Moved: the lab bench is the top-level package lab/ (python -m lab.report, lab.evaluate, ...)."""
