"""Op family: sequence (forward and VJP side by side)."""
