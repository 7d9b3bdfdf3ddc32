"""Preference data: reading, validation with reason codes, tokenisation, manifests, probes."""
