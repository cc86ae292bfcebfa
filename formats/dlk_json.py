"""DeepLearningKit JSON: a Caffe net with its weights as JSON (what caffemodel2json wrote), read and
written.

The document is a Caffe NetParameter in JSON (proto field names)::

    {"name": "...", "input": ["data"], "input_shape": [{"dim": [1, 1, 28, 28]}],
     "layer": [{"name": "conv1", "type": "Convolution", "bottom": ["data"], "top": ["conv1"],
                "convolution_param": {"num_output": 20, "pad": 0, "kernel_size": 5, "stride": 1},
                "blobs": [{"shape": {"dim": [20, 1, 5, 5]}, "data": [...]},   # weights, OIHW
                          {"shape": {"dim": [20]}, "data": [...]}]},          # bias
               {"name": "pool1", "type": "Pooling", ..., "pooling_param": {"pool": 0, "kernel_size": 2, "stride": 2}},
               {"name": "relu1", "type": "ReLU", ...}]}

Reading rules
1. Layers run in list order. ``bottom``/``top`` are used when present; a layer without them reads
   the previous layer's output (DeepLearningKit's own chain semantics).
2. Scalars and one-element lists are accepted for pad/kernel_size/stride (DLK writes scalars,
   caffemodel2json lists); ``pool`` is 0/1/2 or "MAX"/"AVE"/"STOCHASTIC".
3. Every layer then has exactly Caffe's semantics (mconv.formats.caffe): Pooling output size is
   CEIL mode, etc. Layer types beyond DLK's Convolution/Pooling/ReLU (InnerProduct, Softmax, ...)
   are read too; unknown ones are all named in one UnsupportedError.
4. The input shape: top-level ``input_shape``/``input_dim``, an Input layer, or
   ``options["input_shape"]`` (DLK itself passes it at run time).

Writing rules: only Conv (2-D, square kernel/stride, symmetric pads, group 1, no dilation),
MaxPool / AveragePool that Caffe's ceil-mode pooling reproduces exactly, and Relu, in one chain
from the single graph input; every other node is named in one UnsupportedError.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from google.protobuf import json_format
from mconv.errors import InputError, MconvError, UnsupportedError, show
from mconv.fileio import atomic_write_bytes
from mconv.formats import Format
from mconv.formats.caffe import caffe_pooled_size, net_to_model, pb
from mconv.irio import real_inputs, to_proto

CAFFE_TYPES = {
    "Convolution",
    "Pooling",
    "ReLU",
    "InnerProduct",
    "Softmax",
    "Input",
    "Data",
    "LRN",
    "Dropout",
    "Concat",
    "Eltwise",
    "BatchNorm",
    "Scale",
    "Sigmoid",
    "TanH",
    "Flatten",
    "Deconvolution",
}
_POOL_NAMES = {"MAX": 0, "AVE": 1, "STOCHASTIC": 2}
_CONV_REPEATED = ("pad", "kernel_size", "stride", "dilation")
_POOL_SCALAR = ("pad", "kernel_size", "stride")


def _normalize(doc: dict, path: str) -> dict:
    """Bring DLK/caffemodel2json variants to the NetParameter JSON that json_format reads."""
    layers = doc.get("layer")
    if not isinstance(layers, list):
        raise InputError("DLK JSON has no 'layer' list", path=path, hint='expected {"layer": [...]}')
    out = dict(doc)
    fixed = []
    declared = out.get("input")
    previous = (
        declared[0] if isinstance(declared, list) and declared and isinstance(declared[0], str) else None
    )
    for i, layer in enumerate(layers):
        if not isinstance(layer, dict):
            raise InputError(
                "layer entry is not an object",
                path=path,
                where=f"layer[{i}]",
                hint='each layer is {"name", "type", ...}',
            )
        layer = dict(layer)
        name = layer.setdefault("name", f"layer{i}")
        if not isinstance(name, str):
            raise InputError(
                f"layer name is a JSON {type(name).__name__}, not a string",
                path=path,
                where=f"layer[{i}]",
                hint='each layer is {"name": "...", "type": "...", ...}',
            )
        if "convolution_param" in layer and isinstance(layer["convolution_param"], dict):
            p = dict(layer["convolution_param"])
            for key in _CONV_REPEATED:
                if key in p and not isinstance(p[key], list):
                    p[key] = [p[key]]
            _infer_num_output(p, layer)
            layer["convolution_param"] = p
        if isinstance(layer.get("inner_product_param"), dict):
            layer["inner_product_param"] = dict(layer["inner_product_param"])
            _infer_num_output(layer["inner_product_param"], layer)
        if "pooling_param" in layer and isinstance(layer["pooling_param"], dict):
            p = dict(layer["pooling_param"])
            for key in _POOL_SCALAR:
                if isinstance(p.get(key), list):
                    if len(p[key]) != 1:
                        raise InputError(
                            f"pooling_param.{key} must be one number",
                            path=path,
                            where=f"layer '{show(name)}'",
                            hint="use kernel_h/kernel_w for rectangles",
                        )
                    p[key] = p[key][0]
            if isinstance(p.get("pool"), str):
                p["pool"] = _POOL_NAMES.get(p["pool"].upper(), p["pool"])
            layer["pooling_param"] = p
        for key in ("bottom", "top"):
            if isinstance(layer.get(key), str):
                layer[key] = [layer[key]]
            value = layer.get(key)
            if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise InputError(
                    f"'{key}' must be a blob name or a list of blob names",
                    path=path,
                    where=f"layer '{show(name)}'",
                    hint='e.g. "bottom": ["conv1"]',
                )
        # DLK chain semantics: no bottom means "the previous layer's output".
        if "bottom" not in layer and layer.get("type") not in ("Input", "Data"):
            if previous is None:  # DLK feeds the image to the first layer: call it "data"
                previous = "data"
                out["input"] = ["data"]
            layer["bottom"] = [previous]
        if "top" not in layer:
            layer["top"] = [name]
        previous = layer["top"][0] if layer["top"] else previous
        fixed.append(layer)
    out["layer"] = fixed
    return out


def _infer_num_output(param: dict, layer: dict) -> None:
    """DLK files may omit num_output: it is the first weight dimension (Caffe's OIHW / (N, K))."""
    if "num_output" in param:
        return
    try:
        param["num_output"] = int(layer["blobs"][0]["shape"]["dim"][0])
    except (KeyError, IndexError, TypeError, ValueError):
        pass  # left absent: the importer reports the missing num_output for this layer


def load_dlk_json(paths: list[Path], options: dict) -> ir.Model:
    path = paths[0]
    try:
        doc = json.loads(Path(path).read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f"line {exc.lineno}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else None
        raise InputError(
            f"not valid JSON ({show(exc, 100)})",
            path=str(path),
            where=where,
            hint="the file is truncated or not a DLK JSON model",
        ) from None
    except RecursionError:  # json's decoder recurses once per nested array or object
        raise InputError(
            "JSON nests too deeply",
            path=str(path),
            hint="a DLK JSON model nests a few levels; the file is damaged or not a DLK JSON model",
        ) from None
    except ValueError as exc:  # an integer of more than 4300 digits (sys.get_int_max_str_digits)
        raise InputError(
            f"JSON value out of range ({show(exc, 100)})",
            path=str(path),
            hint="the file is damaged or not a DLK JSON model",
        ) from None
    if not isinstance(doc, dict):
        raise InputError(
            "DLK JSON must be an object with a 'layer' list", path=str(path), hint='expected {"layer": [...]}'
        )
    doc = _normalize(doc, str(path))
    net = pb.NetParameter()
    try:
        json_format.ParseDict(doc, net, ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError, RecursionError) as exc:
        raise InputError(
            f"DLK JSON does not fit Caffe's NetParameter: {show(exc, 160)}",
            path=str(path),
            hint="field names and value types must follow caffe.proto",
        ) from None
    notes = [f"read as DeepLearningKit JSON ({len(net.layer)} layers)"]
    return net_to_model(net, None, options, path=str(path), notes=notes)


# ----------------------------------------------------------------------------------------------
# Writing


def _attr(node: ir.Node, name: str, default):
    a = node.attributes.get(name)
    return default if a is None else a.value


def _blob(array: np.ndarray) -> dict:
    a = np.asarray(array, dtype=np.float32)
    return {"shape": {"dim": [int(d) for d in a.shape]}, "data": [float(v) for v in a.ravel()]}


def _pool_param(node: ir.Node, in_shape, out_shape) -> tuple[dict | None, str]:
    """Caffe pooling parameters that reproduce ``node`` exactly, or (None, why not)."""
    kernel = list(_attr(node, "kernel_shape", []))
    strides = list(_attr(node, "strides", [1] * len(kernel)))
    pads = list(_attr(node, "pads", [0] * 2 * len(kernel)))
    if len(kernel) != 2 or kernel[0] != kernel[1] or strides[0] != strides[1]:
        return None, "needs a square 2-D kernel and equal strides"
    if list(_attr(node, "dilations", [1, 1])) != [1, 1] or _attr(node, "auto_pad", "NOTSET") not in (
        "NOTSET",
        b"NOTSET",
    ):
        return None, "dilation and auto_pad have no Caffe equivalent"
    if pads[0] != pads[1] or in_shape is None or out_shape is None:
        return None, "needs equal begin pads and known shapes"
    p, k, s = pads[0], kernel[0], strides[0]
    if p >= k:
        return None, "pad must be smaller than the kernel"
    caffe_out = [caffe_pooled_size(int(d), k, p, s) for d in in_shape[2:]]
    if caffe_out != [int(d) for d in out_shape[2:]]:
        return None, f"Caffe's ceil-mode size {caffe_out} differs from {list(out_shape[2:])}"
    if node.op_type == "AveragePool":
        exact = all((int(d) + 2 * p - k) % s == 0 for d in in_shape[2:])
        symmetric = pads[2:] == pads[:2]
        include = _attr(node, "count_include_pad", 0)
        # Caffe divides by the window clipped to the padded image: ONNX agrees when there is no
        # padding at all, or when pads are counted and no window hangs past the padded image.
        if not (max(pads) == 0 or (include and symmetric and exact)):
            return None, "its divisor differs from Caffe's AVE pooling"
    return {"pool": 0 if node.op_type == "MaxPool" else 1, "pad": p, "kernel_size": k, "stride": s}, ""


def model_to_dlk(model: ir.Model, source: str | None = None) -> dict:
    """The DLK JSON document for ``model`` (raises UnsupportedError naming every node outside DLK's set).

    ``source`` is the model's file, named in every refusal."""
    try:
        proto = onnx.shape_inference.infer_shapes(to_proto(model))
    except Exception as exc:  # onnx raises several types (InferenceError, ValueError above 2 GB, ...)
        raise InputError(
            f"ONNX shape inference failed: {show(exc, 200)}",
            path=source,
            hint="DLK JSON needs every layer's shape; check the model with mconv inspect",
        ) from None
    shapes = {}
    for vi in list(proto.graph.input) + list(proto.graph.value_info) + list(proto.graph.output):
        dims = vi.type.tensor_type.shape.dim
        shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    inputs = real_inputs(model.graph)
    if len(inputs) != 1:
        raise InputError(
            f"DLK JSON holds one input, the model has {len(inputs)}",
            path=source,
            hint="export a single-input model",
        )
    x = inputs[0]
    in_shape = shapes.get(x.name)
    if not in_shape or len(in_shape) != 4 or any(d is None for d in in_shape[1:]):
        raise InputError(
            f"DLK JSON needs a 4-D NCHW input with known C, H, W; '{show(x.name)}' is {in_shape}",
            path=source,
            hint="fix the input shape before exporting",
        )
    layers, bad = [], []
    current = x.name
    for node in model.graph:
        if node.op_type not in ("Conv", "MaxPool", "AveragePool", "Relu") or node.domain not in (
            "",
            "ai.onnx",
        ):
            bad.append((show(node.name or "?"), show(node.op_type)))
            continue
        src = node.inputs[0].name if node.inputs and node.inputs[0] is not None else None
        if not node.outputs:
            bad.append((show(node.name or "?"), f"{node.op_type} without outputs"))
            continue
        out = node.outputs[0].name
        if src != current:
            bad.append((show(node.name or "?"), f"{node.op_type} off the chain"))
            continue
        layer: dict[str, object] = {"name": node.name or out, "type": None, "bottom": [src], "top": [out]}
        if node.op_type == "Relu":
            layer["type"] = "ReLU"
        elif node.op_type == "Conv":
            param, why = _checked(_conv_param, node, model)
            if param is None:
                bad.append((show(node.name or "?"), f"Conv ({why})"))
                continue
            layer["type"] = "Convolution"
            layer["convolution_param"] = param.pop("param")
            layer["blobs"] = param["blobs"]
        else:
            param, why = _checked(_pool_param, node, shapes.get(src), shapes.get(out))
            if param is None:
                bad.append((show(node.name or "?"), f"{node.op_type} ({why})"))
                continue
            layer["type"] = "Pooling"
            layer["pooling_param"] = param
        layers.append(layer)
        current = out
    if bad:
        raise UnsupportedError(
            bad, what="node", path=source, hint="DLK JSON holds Convolution, Pooling and ReLU only"
        )
    if not layers:
        raise InputError(
            "the model has no layer DLK can run",
            path=source,
            hint="DLK JSON holds Convolution, Pooling and ReLU",
        )
    outputs = [v.name for v in model.graph.outputs]
    if outputs != [current]:
        shown = ", ".join(f"'{show(o)}'" for o in outputs[:4]) + (", ..." if len(outputs) > 4 else "")
        raise InputError(
            f"the model's outputs [{shown}] are not the end of the layer chain ('{show(current)}')",
            path=source,
            hint="DLK runs one chain of layers to one output",
        )
    batch = in_shape[0] if isinstance(in_shape[0], int) and in_shape[0] > 0 else 1
    return {
        "name": model.graph.name or "net",
        "input": [x.name],
        "input_shape": [{"dim": [batch, *in_shape[1:]]}],
        "layer": layers,
    }


def _checked(derive, node: ir.Node, *args) -> tuple[dict | None, str]:
    """``derive(node, ...)``, with attributes of the wrong length or type reported as a reason."""
    try:
        return derive(node, *args)
    except (IndexError, TypeError, ValueError, AttributeError) as exc:
        return None, f"malformed attributes: {type(exc).__name__}"


def _conv_param(node: ir.Node, model: ir.Model) -> tuple[dict | None, str]:
    kernel = list(_attr(node, "kernel_shape", []))
    w_val = node.inputs[1] if len(node.inputs) > 1 else None
    w = w_val.const_value if w_val is not None else None
    if w is None:
        return None, "weights are not constant"
    weights = w.numpy()
    kernel = kernel or list(weights.shape[2:])
    strides = list(_attr(node, "strides", [1, 1]))
    pads = list(_attr(node, "pads", [0, 0, 0, 0]))
    if weights.ndim != 4 or kernel[0] != kernel[1] or strides[0] != strides[1]:
        return None, "needs a square 2-D kernel and equal strides"
    if len(set(pads)) > 1 or _attr(node, "group", 1) != 1 or list(_attr(node, "dilations", [1, 1])) != [1, 1]:
        return None, "needs equal pads on all sides, group 1 and no dilation"
    if _attr(node, "auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return None, "auto_pad has no Caffe equivalent"
    b_val = node.inputs[2] if len(node.inputs) > 2 else None
    b_const = b_val.const_value if b_val is not None else None
    if b_val is not None and b_const is None:
        return None, "bias is not constant"
    bias = b_const.numpy() if b_const is not None else np.zeros(weights.shape[0], np.float32)
    param = {
        "num_output": int(weights.shape[0]),
        "pad": int(pads[0]),
        "kernel_size": int(kernel[0]),
        "stride": int(strides[0]),
    }
    return {"param": param, "blobs": [_blob(weights), _blob(bias)]}, ""


def save_dlk_json(model: ir.Model, dest: Path, options: dict) -> list[Path]:
    """Write ``model`` as DLK JSON; ``options["source"]`` (the model's file) is named in refusals."""
    source = options.get("source")
    try:
        doc = model_to_dlk(model, source)
    except MconvError as exc:
        if exc.path is None and source:  # e.g. shape inference refusing the graph
            exc.path = str(source)
        raise
    atomic_write_bytes(dest, json.dumps(doc, separators=(",", ":")).encode())
    return [Path(dest)]


def _sniff(head: bytes, path: Path) -> bool:
    text = head.lstrip()
    if not text.startswith(b"{") or b'"layer"' not in text or b'"class_name"' in text:
        return False
    return any(f'"{t}"'.encode() in text for t in CAFFE_TYPES)


FORMAT = Format(
    name="dlk-json",
    description="DeepLearningKit JSON (Caffe net + weights as JSON)",
    extensions=(".json",),
    load=load_dlk_json,
    save=save_dlk_json,
    sniff=_sniff,
)

__all__ = ["FORMAT", "load_dlk_json", "save_dlk_json", "model_to_dlk"]
