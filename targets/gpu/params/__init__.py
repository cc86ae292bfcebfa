"""The per-family parameter math of the GPU kernels (shapes, strides, pads, broadcast strides,
tables and constants computed from node attributes), shared by the MSL and WGSL emitters: a
family module here is named as the reference executor's (``conv``, ``shape``, ...), and holds
no kernel text."""
