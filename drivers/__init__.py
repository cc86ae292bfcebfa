"""Drivers: the programs that build and run pipelines of passes over engines and targets.

``budget`` (Deep Compression under a byte or accuracy budget), ``analyze`` (per-layer
sensitivity), ``parallel`` (independent trials on Ray) and ``weights_stream`` (compressing a
safetensors file tensor by tensor without building a graph). They sit above passes, formats and
targets and below the API.
"""
