"""Recording (torch): model loading, packaged models, trajectory recorder."""
