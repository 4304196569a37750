"""What tests and benchmarks share and production never runs: a synthetic `training_samples` writer, a
throwaway redis-server and the faults tests inject into a copy of a data root. Not an installed package
(pyproject's include list leaves it out): tests reach it through pytest's `pythonpath = ["."]`, benchmarks
through the repository root they put on sys.path, and no genrank package imports it (tests/test_layering.py)."""
