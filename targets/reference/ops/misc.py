"""Op family: misc (forward and VJP side by side)."""
