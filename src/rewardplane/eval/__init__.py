"""Evaluation: frozen probe, per-pair artifacts, paired bootstrap, comparison, report."""
