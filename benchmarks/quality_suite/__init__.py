"""The model-quality report's parts (benchmarks/quality_report.py runs them; calibration_window.py and
counter_probe.py reuse them): worlds and their training samples (worlds, samples), the simulator's oracle
(oracle), baselines without a sequence model (baselines), the models and their variants (variants), how they
train (protocol: from scratch, and the pipeline's daily chain), one seed's runs (runs) and the markdown (report).
Not named `quality`: that is the repository's data-quality package."""
