"""Op family: activation (forward and VJP side by side)."""
