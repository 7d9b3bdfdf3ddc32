"""Qualification: load generation, sweeps, stability windows, parity across deployment modes."""
