"""Training: one loop, objectives as components, DDP/FSDP2, strict checkpoints."""
