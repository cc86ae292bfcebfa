"""Op family: controlflow (forward and VJP side by side)."""
