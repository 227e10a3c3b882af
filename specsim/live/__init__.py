"""Real speculative decoding (torch): the ground truth the simulator is checked against."""
