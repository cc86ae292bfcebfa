"""Op family: shape (forward and VJP side by side)."""
