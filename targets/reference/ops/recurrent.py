"""Op family: recurrent (forward and VJP side by side)."""
