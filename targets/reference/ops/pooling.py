"""Op family: pooling (forward and VJP side by side)."""
