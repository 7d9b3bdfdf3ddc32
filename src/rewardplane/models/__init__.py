"""Models: the scalar-head reward model, policy loading and reference provenance."""
