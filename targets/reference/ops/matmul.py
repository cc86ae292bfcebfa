"""Op family: matmul (forward and VJP side by side)."""
