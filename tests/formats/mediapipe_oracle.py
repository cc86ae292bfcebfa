"""Run face_landmark_with_attention.tflite in MediaPipe's own InferenceCalculator (with MediaPipe's
custom op resolver, TfLiteCustomOpResolverCalculator) on an image; write its 7 outputs to an npz.

Run by test_tflite_mediapipe.py with the Python of a venv holding mediapipe==0.10.14 (installed
without dependencies). Only the C++ framework bindings are loaded: the package's __init__ (which
imports OpenCV and the solutions) is bypassed with empty parent modules. ImageToTensorCalculator
maps the 192x192 uint8 picture to [0, 1] floats (identity geometry), as the test feeds the import.
Usage: python mediapipe_oracle.py IN.npy OUT.npz MODEL.tflite"""

import os
import sys
import types

import numpy as np

site = next(
    p for p in sys.path if p.endswith("site-packages") and os.path.isdir(os.path.join(p, "mediapipe"))
)
for name, sub in [("mediapipe", "mediapipe"), ("mediapipe.python", "mediapipe/python")]:
    m = types.ModuleType(name)
    m.__path__ = [os.path.join(site, sub)]
    sys.modules[name] = m
import mediapipe.python._framework_bindings as fb  # noqa: E402  (after the stub parents)

model = sys.argv[3]
n_out = 7
split = "".join(f"ranges: {{ begin: {k} end: {k + 1} }} " for k in range(n_out))
cfg = f'''
input_stream: "image"
node {{ calculator: "TfLiteCustomOpResolverCalculator" output_side_packet: "OP_RESOLVER:op_resolver" }}
node {{ calculator: "ImageToTensorCalculator" input_stream: "IMAGE:image" output_stream: "TENSORS:input_tensors"
  options {{ [mediapipe.ImageToTensorCalculatorOptions.ext] {{ output_tensor_width: 192 output_tensor_height: 192
    keep_aspect_ratio: false output_tensor_float_range {{ min: 0.0 max: 1.0 }} }} }} }}
node {{ calculator: "InferenceCalculator" input_stream: "TENSORS:input_tensors" output_stream: "TENSORS:out"
  input_side_packet: "OP_RESOLVER:op_resolver"
  options {{ [mediapipe.InferenceCalculatorOptions.ext] {{ model_path: "{model}" delegate {{ tflite {{}} }} }} }} }}
node {{ calculator: "SplitTensorVectorCalculator" input_stream: "out"
  {"".join(f'output_stream: "t{k}" ' for k in range(n_out))}
  options {{ [mediapipe.SplitVectorCalculatorOptions.ext] {{ {split} }} }} }}
''' + "".join(
    f"""node {{ calculator: "TensorsToFloatsCalculator" input_stream: "TENSORS:t{k}" output_stream: "FLOATS:f{k}" }}
output_stream: "f{k}"
"""
    for k in range(n_out)
)
g = fb.calculator_graph.CalculatorGraph(graph_config=cfg)
outs = {}
for k in range(n_out):
    g.observe_output_stream(
        f"f{k}", lambda name, p, k=k: outs.__setitem__(k, np.array(fb._packet_getter.get_float_list(p)))
    )
g.start_run()
img = np.load(sys.argv[1])
pkt = fb._packet_creator._create_image_frame_from_pixel_data(
    fb.image_frame.ImageFormat.SRGB, np.ascontiguousarray(img), True
)
g.add_packet_to_input_stream("image", pkt.at(0))
g.close()
np.savez(sys.argv[2], **{f"out_{k}": v for k, v in outs.items()})
print("ok", {k: v.shape for k, v in outs.items()})
