"""Op family: normalization (forward and VJP side by side)."""
