"""Op family: reduction (forward and VJP side by side)."""
