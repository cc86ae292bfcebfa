"""Op family: indexing (forward and VJP side by side)."""
