"""Replay (numpy only): draft trees over cached distributions, policies, metrics."""
