"""Op family: elementwise (forward and VJP side by side)."""
