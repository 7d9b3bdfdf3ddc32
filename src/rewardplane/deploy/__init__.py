"""Deployment: supervised scorer workers, GPU sharing, managed CUDA MPS, Ray Serve."""
