"""``gradwire plan``: choose the algorithm, compressor and cluster size from fitted models.

system_model.py (Ernest's f(m), NNLS) · convergence.py (g(i, m)) · design.py (which profiling runs,
under a budget) · planner.py (runs, fits, predictions, recommendation, validation) · output.py
(plan.json, plan.md, plan.png). See docs/planning.md.
"""
