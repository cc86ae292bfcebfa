"""The GPU backend shared by the metal and webgpu targets: one planner, two dialects.

- :mod:`.plan`: prepare a model (static shapes, folding, contrib rewrites, If rules) and lower
  it to a :class:`~.plan.GpuPlan` (buffers, layers, grids) through a :class:`~.plan.Dialect`;
- :mod:`.ops`: the op classes (fusible, exact on integers), :class:`~.ops.Activation`, the
  lowering context; :mod:`.params`: each op family's parameter math (shapes, strides, pads,
  tables computed from attributes); :mod:`.expr`: expression text both dialects spell alike;
- :mod:`.contrib`, :mod:`.ifs`: graph rewrites before planning; :mod:`.graph`,
  :mod:`.bundle`: what a bundle ships and how a loader regenerates and checks it.

The dialects (:mod:`mconv.targets.metal.msl` MSL, :mod:`mconv.targets.webgpu.wgsl` WGSL)
write kernel text only; neither imports the other (``tests/targets/test_gpu_backend.py``).
"""
