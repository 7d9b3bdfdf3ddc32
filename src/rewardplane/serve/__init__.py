"""The reward service: HTTP API, scorer registry, dynamic batching, client."""
