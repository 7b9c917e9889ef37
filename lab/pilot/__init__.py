"""Scripts of the arithmetic pilot (results/arithmetic_cpu_pilot): the checks its DESIGN.md names, run as
``python -m lab.pilot.<name>``; what they wrote stays in that folder."""
