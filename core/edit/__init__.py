"""IR editing helpers every layer may use: ``rewrite`` (names, initializers, value replacement),
``weights`` (a weight reference read and written without holding the model in memory),
``channels`` (which axis of a weight is its output channel), ``input_shapes`` (``--input-shape``
applied to a graph's inputs)."""
