"""Tree attention (torch): implementations, timing sweeps and cost profiles."""
