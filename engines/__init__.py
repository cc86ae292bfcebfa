"""Engines: the programs that compute a model's tensors in this process.

``reference`` is the numpy interpreter that verification trusts and that differentiates a model
(calibration, sensitivity, fine-tuning); ``xla`` lowers a model to JAX for the same jobs on CPU or
GPU; ``fast`` picks the engine a long data-driven run uses (xla when jax is present and
the work pays for its compiles) and keeps compiled programs for the run. Engines sit on core only: passes and targets use them, never the other way round. A target
is a deployable bundle format; an engine has no bundle (the ``reference`` and ``xla`` targets are
thin adapters over these engines).
"""
