"""Op family: conv (forward and VJP side by side)."""
