"""Recipes: an objective plus the data it trains on, wired into the one training loop."""
