"""The XLA engine: ``lower/`` turns an ``onnx_ir.Model`` into a JAX function (one module per op
family); ``engine`` runs and differentiates it for calibration and fine-tuning; ``jit`` holds the
compile options every jitted function uses (the xla target's runtime reads them too)."""
