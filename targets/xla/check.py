"""Checking an xla bundle's program before anything of it is deserialized for a call.

``jax.export.deserialize`` trusts its input: the StableHLO module it holds may call any custom
call registered in the process (``xla_ffi_python_cpu_callback`` with an index out of range reads
process memory), and jax checks custom-call targets only when exporting. A bundle is data, so the
loader reads ``model.jax_export`` without executing anything of it and refuses (InputError, exit
2, naming what it found) whatever mconv's exporter does not write.

Rules:

1. The ``Exported`` flatbuffer is read field by field with jax's own schema (pure Python): one
   device, platforms among cpu/cuda/rocm/tpu and equal to ``xla.json``'s, no disabled safety
   checks, no effects, no shardings or meshes, no nested VJP program; as many input avals as
   ``xla.json`` has inputs plus weight arguments and as many output avals as outputs, each with
   the dtype and shape ``xla.json`` states (weights in their ``layout``); ``xla.json``'s inputs
   and outputs are the manifest's. Every static dimension of a spec is a non-negative integer and
   no spec needs ``MAX_SPEC_BYTES`` or more.
2. The module (a StableHLO portable artifact) is deserialized and verified with jaxlib's MLIR
   bindings, which parse and never execute, and every operation is checked against
   ``ALLOWED_OPS``: the StableHLO, CHLO and ``func`` operations that compute on tensors. Refused:
   I/O and channels (infeed, outfeed, send, recv, tokens), collectives and device ids (an xla
   bundle is one device's program), random-number ops (a bundle's program is deterministic),
   ``func.call_indirect``/``func.constant``, any other dialect. ``stablehlo.composite`` (how the
   portable artifact carries a CHLO op, with its decomposition as a function of the module) only
   under the name of an allowed CHLO op.
3. ``stablehlo.custom_call`` only to a target in ``CUSTOM_CALLS``, the targets jax writes for the
   lowerings mconv uses (``shape_assertion`` for symbolic shapes; the LU factorization of ``Det``
   on cpu, cuda, rocm and tpu), each with the operand and result types, layouts, aliases,
   attributes and API version those lowerings give it: a target's handler trusts them.
4. MLIR's bytecode reader is not hardened against damaged input (a flipped bit can crash the
   process), so rules 2-3 run in a child process (the same interpreter, given the payload on
   stdin) where a crash kills only the child; the loader deserializes the program for the call
   only after the child found it sound. MLIR and XLA print their diagnostics on file descriptor
   2 from C++: it is redirected to a temporary file while the program is read, and any failure
   is one InputError line.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from mconv.errors import InputError, MconvError, show

PAYLOAD = "model.jax_export"
CONVENTION = "xla.json"
_HINT = "the bundle was modified or is not mconv's; re-export it with mconv export --target xla"
_HINT_BAD = "the bundle was modified or truncated; re-export it"
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
MAX_SPEC_BYTES = 1 << 48
"""An input, output or weight spec of more bytes than this (256 TiB) is refused (rule 1)."""

_STABLEHLO_OPS = """
abs add and atan2 batch_norm_grad batch_norm_inference batch_norm_training bitcast_convert
broadcast broadcast_in_dim case cbrt ceil cholesky clamp compare complex concatenate constant
convert convolution cosine count_leading_zeros divide dot dot_general dynamic_broadcast_in_dim
dynamic_conv dynamic_gather dynamic_iota dynamic_pad dynamic_reshape dynamic_slice
dynamic_update_slice einsum exponential exponential_minus_one fft floor gather
get_dimension_size get_tuple_element if imag iota is_finite log log_plus_one logistic map maximum
minimum multiply negate not optimization_barrier or pad popcnt power real real_dynamic_slice
reduce reduce_precision reduce_window remainder reshape return reverse round_nearest_afz
round_nearest_even rsqrt scatter select select_and_scatter set_dimension_size shift_left
shift_right_arithmetic shift_right_logical sign sine slice sort sqrt subtract tan tanh
torch_index_select transpose triangular_solve tuple unary_einsum uniform_dequantize
uniform_quantize while xor
"""
_CHLO_OPS = """
_asin_acos_kernel acos acosh asin asinh atan atanh bessel_i1e broadcast_add broadcast_and
broadcast_atan2 broadcast_compare broadcast_complex broadcast_divide broadcast_maximum
broadcast_minimum broadcast_multiply broadcast_next_after broadcast_or broadcast_polygamma
broadcast_power broadcast_remainder broadcast_select broadcast_shift_left
broadcast_shift_right_arithmetic broadcast_shift_right_logical broadcast_subtract broadcast_xor
broadcast_zeta conj constant constant_like cosh digamma erf erf_inv erfc is_inf is_neg_inf
is_pos_inf lgamma mulhi next_after polygamma ragged_dot sinh square tan top_k zeta
"""
ALLOWED_OPS = frozenset(
    [
        "builtin.module",
        "func.func",
        "func.call",
        "func.return",
        "stablehlo.custom_call",
        "stablehlo.composite",
    ]
    + [f"stablehlo.{n}" for n in _STABLEHLO_OPS.split()]
    + [f"chlo.{n}" for n in _CHLO_OPS.split()]
)

_GETRF = {f"lapack_{c}getrf_ffi" for c in "sdcz"} | {"cusolver_getrf_ffi", "hipsolver_getrf_ffi"}
_PIVOTS = {"cu_lu_pivots_to_permutation", "hip_lu_pivots_to_permutation"}
_LAPACK_TYPES = {"s": "f32", "d": "f64", "c": "complex<f32>", "z": "complex<f64>"}
_FLOAT_TYPES = set(_LAPACK_TYPES.values()) | {"f16", "bf16"}
CUSTOM_CALLS = frozenset(_GETRF | _PIVOTS | {"LuDecomposition", "shape_assertion"})
"""The custom-call targets mconv's exporter writes (rule 3)."""

_FFI_API = (None, 4)  # jax's FFI lowerings leave api_version at its default (typed FFI)
_COMMON_ATTRS = {"call_target_name", "api_version", "has_side_effect", "indices_of_shape_operands"}
_FFI_ATTRS = _COMMON_ATTRS | {
    "mhlo.backend_config",
    "backend_config",
    "operand_layouts",
    "result_layouts",
    "output_operand_aliases",
    "mhlo.frontend_attributes",
    "sdy.sharding_rule",
}


class _Refused(Exception):
    """A finding of the checks (becomes the InputError's message)."""


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """File descriptor 2 redirected to a temporary file; its text is appended to the list."""
    sys.stderr.flush()
    text: list[str] = []
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield text
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text.append(tmp.read(4096).decode("utf-8", errors="replace"))


# ----------------------------------------------------------------------------- xla.json and avals


def _dims(shape: Any, field: str) -> list:
    if not isinstance(shape, list):
        raise _Refused(f"{CONVENTION}: {field} is not a list")
    for d in shape:
        if isinstance(d, bool) or not (isinstance(d, str) or (isinstance(d, int) and d >= 0)):
            raise _Refused(f"{CONVENTION}: {field} has the dimension {show(repr(d), 30)}")
    return shape


def _bounded(shape: list, dtype: str, field: str) -> None:
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:
        raise _Refused(f"{CONVENTION}: {field} has the unknown dtype '{show(dtype, 30)}'") from None
    if math.prod(d for d in shape if isinstance(d, int)) * itemsize >= MAX_SPEC_BYTES:
        raise _Refused(f"{CONVENTION}: {field} has shape {show(repr(shape), 80)}, too large for any array")


def _spec(d: Any, field: str) -> tuple[str, str, list | None]:
    if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not isinstance(d.get("dtype"), str):
        raise _Refused(f"{CONVENTION}: {field} is not a spec with a name and a dtype")
    shape = d.get("shape")
    if shape is not None:
        _bounded(_dims(shape, f"{field}.shape"), d["dtype"], field)
    return d["name"], d["dtype"], shape


def _aval(aval: Any) -> tuple[str, list]:
    return np.dtype(aval.dtype).name, [d if isinstance(d, int) else str(d) for d in aval.shape]


def _check_convention(conv: Any, manifest: Mapping) -> None:
    if not isinstance(conv, dict):
        raise _Refused(f"{CONVENTION} is not an object")
    for key in ("inputs", "weight_args", "outputs"):
        if not isinstance(conv.get(key), list):
            raise _Refused(f"{CONVENTION}: '{key}' is not a list")
    inputs = [_spec(d, f"inputs[{i}]") for i, d in enumerate(conv["inputs"])]
    for i, w in enumerate(conv["weight_args"]):
        name, dtype, shape = _spec(w, f"weight_args[{i}]")
        if shape is None or not all(isinstance(d, int) for d in shape):
            raise _Refused(f"{CONVENTION}: weight_args[{i}] has no fixed shape")
        layout = w.get("layout")
        if layout is not None and (
            not isinstance(layout, list)
            or sorted(x for x in layout if type(x) is int) != list(range(len(shape)))
        ):
            raise _Refused(f"{CONVENTION}: weight_args[{i}].layout is not a permutation of its axes")
    if not all(isinstance(n, str) for n in conv["outputs"]):
        raise _Refused(f"{CONVENTION}: 'outputs' is not a list of names")
    specs = conv.get("output_specs")
    outputs = None
    if specs is not None:
        if not isinstance(specs, list) or len(specs) != len(conv["outputs"]):
            raise _Refused(f"{CONVENTION}: 'output_specs' does not match 'outputs'")
        outputs = [_spec(d, f"output_specs[{i}]") for i, d in enumerate(specs)]
    # the manifest describes the same program (inspect and the random feeds read either)
    for key, ours in (("inputs", inputs), ("outputs", outputs)):
        theirs = manifest.get(key)
        if theirs is None or ours is None:
            continue
        got = [(d.get("name"), d.get("dtype"), d.get("shape")) if isinstance(d, dict) else d for d in theirs]
        if got != [tuple(s) for s in ours]:
            raise _Refused(f"manifest.json's {key} are not the {key} of {CONVENTION}")


def _check_exported(exp: Any, conv: dict) -> None:
    """Rule 1 on jax's deserialized Exported (its fields only; nothing of it has run)."""
    if exp.nr_devices != 1:
        raise _Refused(f"the program is for {exp.nr_devices} devices, not one")
    if exp.disabled_safety_checks:
        raise _Refused(f"the program disables jax's safety checks ({show(exp.disabled_safety_checks, 80)})")
    if exp.ordered_effects or exp.unordered_effects:
        raise _Refused("the program has effects")
    n_in, n_w = len(conv["inputs"]), len(conv["weight_args"])
    if len(exp.in_avals) != n_in + n_w or len(exp.out_avals) != len(conv["outputs"]):
        raise _Refused(
            f"the program takes {len(exp.in_avals)} arguments and gives {len(exp.out_avals)} results; "
            f"{CONVENTION} says {n_in}+{n_w} and {len(conv['outputs'])}"
        )
    for i, (aval, d) in enumerate(zip(exp.in_avals, conv["inputs"])):
        dtype, shape = _aval(aval)
        if dtype != d["dtype"] or (d.get("shape") is not None and shape != d["shape"]):
            raise _Refused(f"{CONVENTION}: inputs[{i}] is not the program's argument {dtype}{shape}")
    for i, (aval, w) in enumerate(zip(exp.in_avals[n_in:], conv["weight_args"])):
        shape = list(w["shape"]) if w.get("layout") is None else [w["shape"][p] for p in w["layout"]]
        if _aval(aval) != (w["dtype"], shape):
            raise _Refused(f"{CONVENTION}: weight_args[{i}] is not the program's argument {_aval(aval)}")
    for i, aval in enumerate(exp.out_avals):
        spec = (conv.get("output_specs") or [None] * len(exp.out_avals))[i]
        if (
            spec is not None
            and spec.get("shape") is not None
            and _aval(aval) != (spec["dtype"], spec["shape"])
        ):
            raise _Refused(f"{CONVENTION}: output_specs[{i}] is not the program's result {_aval(aval)}")


def _check_flatbuffer(data: bytes, conv: dict) -> None:
    """Rule 1 on the raw flatbuffer, before jax's reader builds shardings from it."""
    from jax._src.export import serialization_generated as fb

    e = fb.Exported.GetRootAsExported(bytearray(data), 0)
    if e.Vjp() is not None:
        raise _Refused("the program carries a VJP program")
    # one device: every sharding unspecified, in the indexed form and the older per-argument one
    # (whose HloSharding protos jax would parse in C++)
    legacy = [e.InShardings(i) for i in range(e.InShardingsLength())]
    legacy += [e.OutShardings(i) for i in range(e.OutShardingsLength())]
    idxs = [e.InShardingsIdxs(i) for i in range(e.InShardingsIdxsLength())]
    idxs += [e.OutShardingsIdxs(i) for i in range(e.OutShardingsIdxsLength())]
    if (
        e.UniqueNamedShardingsLength()
        or e.UniqueAbstractMeshesLength()
        or any(idxs)
        or any(s.NamedSharding() is not None or not s.HloShardingProtoIsNone() for s in legacy)
    ):
        raise _Refused("the program has shardings")
    if e.DisabledChecksLength():
        raise _Refused("the program disables jax's safety checks")
    if e.OrderedEffectsLength() or e.UnorderedEffectsLength():
        raise _Refused("the program has effects")
    platforms = [e.Platforms(i).decode("utf-8", errors="replace") for i in range(e.PlatformsLength())]
    bad = [p for p in platforms if p not in PLATFORMS]
    if not platforms or bad:
        raise _Refused(f"the program's platforms {show(platforms, 80)} are not among {', '.join(PLATFORMS)}")
    if conv.get("platforms") is not None and conv["platforms"] != platforms:
        raise _Refused(f"the program's platforms {platforms} are not {CONVENTION}'s")


# ----------------------------------------------------------------------------- the module


def _ranked(t: Any) -> Any:
    from jax._src.lib.mlir import ir

    try:
        return ir.RankedTensorType(t)
    except (ValueError, TypeError):
        return None


def _tensor(value: Any) -> tuple[list[int | None], str]:
    """(dims, element type) of a ranked tensor value; None marks a dynamic dimension."""

    rt = _ranked(value.type)
    if rt is None:
        raise _Refused(f"a custom call has the operand or result type {show(str(value.type), 60)}")
    dims = [None if rt.is_dynamic_dim(i) else rt.get_dim_size(i) for i in range(rt.rank)]
    return dims, str(rt.element_type)


def _ints(attr: Any) -> list[int]:
    from jax._src.lib.mlir import ir

    return [int(x) for x in np.asarray(ir.DenseIntElementsAttr(attr)).reshape(-1)]


def _check_custom_call(op: Any, target: str) -> None:
    """Rule 3: the call as jax's lowering writes it for ``target``."""
    from jax._src.lib.mlir import ir

    attrs = {a.name if hasattr(a, "name") else a: op.attributes[a] for a in op.attributes}
    attrs = {str(k): v for k, v in attrs.items()}
    allowed = _COMMON_ATTRS | ({"error_message"} if target == "shape_assertion" else set())
    if target in _GETRF or target in _PIVOTS:
        allowed = _FFI_ATTRS
    extra = sorted(set(attrs) - allowed)
    if extra:
        raise _Refused(f"custom call '{target}' has the attribute '{show(extra[0], 40)}'")
    api = ir.IntegerAttr(attrs["api_version"]).value if "api_version" in attrs else None
    side = ir.BoolAttr(attrs["has_side_effect"]).value if "has_side_effect" in attrs else False
    if "backend_config" in attrs and str(attrs["backend_config"]) not in ('""', "{}"):
        raise _Refused(f"custom call '{target}' has a backend_config")
    if "mhlo.backend_config" in attrs and str(attrs["mhlo.backend_config"]) != "{}":
        raise _Refused(f"custom call '{target}' has a backend_config")
    operands, results = list(op.operands), list(op.results)
    n_shape = len(_ints(attrs["indices_of_shape_operands"])) if "indices_of_shape_operands" in attrs else 0
    if n_shape:
        idx = _ints(attrs["indices_of_shape_operands"])
        if idx != list(range(len(operands) - n_shape, len(operands))) or n_shape != len(results):
            raise _Refused(f"custom call '{target}' has bad shape operands")
        for v in operands[-n_shape:]:
            dims, et = _tensor(v)
            if len(dims) != 1 or et not in ("i32", "i64"):
                raise _Refused(f"custom call '{target}' has bad shape operands")
        operands = operands[:-n_shape]

    if target == "shape_assertion":
        if api != 2 or not side or results or not operands or "error_message" not in attrs:
            raise _Refused("custom call 'shape_assertion' is not a shape assertion")
        types = [_tensor(v) for v in operands]
        if types[0] != ([], "i1") or any(t[0] != [] or t[1] not in ("i32", "i64") for t in types[1:]):
            raise _Refused("custom call 'shape_assertion' is not a shape assertion")
        message = ir.StringAttr(attrs["error_message"]).value
        for m in re.finditer(r"\{+([^{}]*)\}+", message):
            ref = m.group(1)
            if not ref.isdigit() or int(ref) >= len(operands) - 1:
                raise _Refused("custom call 'shape_assertion' has a bad error message")
        return
    if side:
        raise _Refused(f"custom call '{target}' has side effects")
    if target == "LuDecomposition":
        if api != 2:
            raise _Refused(f"custom call '{target}' has API version {api}")
    elif api not in _FFI_API:
        raise _Refused(f"custom call '{target}' has API version {api}")
    if len(operands) != 1:
        raise _Refused(f"custom call '{target}' takes {len(operands)} operands")
    dims, et = _tensor(operands[0])
    out = [_tensor(v) for v in results]
    if target in _PIVOTS:
        if et != "i32" or not dims or len(out) != 1 or out[0][1] != "i32" or out[0][0][:-1] != dims[:-1]:
            raise _Refused(f"custom call '{target}' has operand or result types it does not take")
    else:
        if len(dims) < 2 or et not in _FLOAT_TYPES or len(out) != 3:
            raise _Refused(f"custom call '{target}' has operand or result types it does not take")
        rows, cols = dims[-2], dims[-1]
        k = None if rows is None or cols is None else min(rows, cols)
        want = [(dims, et), ([*dims[:-2], k], "i32"), ([*dims[:-2]], "i32")]
        if target == "LuDecomposition":
            want[2] = ([*dims[:-2], rows], "i32")
        if target.startswith("lapack_") and et != _LAPACK_TYPES[target[len("lapack_")]]:
            raise _Refused(f"custom call '{target}' has operand or result types it does not take")
        if out != want:
            raise _Refused(f"custom call '{target}' has operand or result types it does not take")
    for key, values in (("operand_layouts", list(op.operands)), ("result_layouts", results)):
        if key not in attrs:
            continue
        layouts = ir.ArrayAttr(attrs[key])
        if len(layouts) != len(values):
            raise _Refused(f"custom call '{target}' has bad {key}")
        for layout, v in zip(layouts, values):
            if sorted(_ints(layout)) != list(range(len(_tensor(v)[0]))):
                raise _Refused(f"custom call '{target}' has bad {key}")
    if "output_operand_aliases" in attrs:
        aliases = [str(a) for a in ir.ArrayAttr(attrs["output_operand_aliases"])]
        ok = "#stablehlo.output_operand_alias<output_tuple_indices = [0], operand_index = 0, operand_tuple_indices = []>"
        if target not in _GETRF or aliases not in ([], [ok]):
            raise _Refused(f"custom call '{target}' has bad output_operand_aliases")


def _signature_types(fn: Any) -> tuple[list, list]:
    from jax._src.lib.mlir import ir

    ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
    return list(ftype.inputs), list(ftype.results)


def _check_main(main: Any, exp: Any) -> None:
    """The public ``main``: the Exported's kept arguments and its results, in dtype and rank."""
    from jax._src.interpreters import mlir

    ins, outs = _signature_types(main)
    kept = [exp.in_avals[i] for i in exp.module_kept_var_idx]
    if len(outs) != len(exp.out_avals) or len(ins) < len(kept):
        raise _Refused("the program's main function does not take the arguments its header states")
    for t, aval in zip([*ins[len(ins) - len(kept) :], *outs], [*kept, *exp.out_avals]):
        rt = _ranked(t)
        if rt is None:
            raise _Refused("the program's main function does not take the arguments its header states")
        if rt.rank != len(aval.shape) or rt.element_type != mlir.dtype_to_ir_type(np.dtype(aval.dtype)):
            raise _Refused("the program's main function does not take the arguments its header states")
        for i, d in enumerate(aval.shape):
            if isinstance(d, int) and not rt.is_dynamic_dim(i) and rt.get_dim_size(i) != d:
                raise _Refused("the program's main function does not take the arguments its header states")


def _check_module(module_bytes: bytes, exp: Any) -> None:
    """Rules 2 and 3: the module deserialized (parsed, not run), verified and walked."""
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax
    from jax._src.lib.mlir import ir

    with mlir.make_ir_context():
        module = _jax.mlir.deserialize_portable_artifact(module_bytes)
        if not module.operation.verify():
            raise _Refused("the program's module does not verify")
        main = None
        stack = [module.operation]
        while stack:
            op = stack.pop().operation
            name = op.name
            if name not in ALLOWED_OPS:
                raise _Refused(
                    f"the program uses the operation '{show(name, 60)}', which mconv does not write"
                )
            if name == "stablehlo.custom_call":
                target = ir.StringAttr(op.attributes["call_target_name"]).value
                if target not in CUSTOM_CALLS:
                    raise _Refused(
                        f"the program calls the custom call '{show(target, 60)}', which mconv does not write"
                    )
                _check_custom_call(op, target)
            elif name == "stablehlo.composite":
                # how a portable artifact carries a CHLO op: its decomposition is a function of
                # the module (walked like the others); the name is one of the CHLO ops allowed
                composite = ir.StringAttr(op.attributes["name"]).value
                if composite not in ALLOWED_OPS or not composite.startswith("chlo."):
                    raise _Refused(
                        f"the program uses the composite '{show(composite, 60)}', which mconv does not write"
                    )
            elif name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
                main = op
            for region in op.regions:
                for block in region:
                    stack.extend(block)
        if main is None:
            raise _Refused("the program's module has no main function")
        _check_main(main, exp)


_CHILD = "from mconv.targets.xla.check import child_main; child_main()"
CHILD_TIMEOUT_S = 600


def child_main() -> None:
    """The child of :func:`_module_in_child`: the payload on stdin, one verdict line on stdout."""
    import jax

    data = sys.stdin.buffer.read()
    try:
        with captured_stderr():
            exported = jax.export.deserialize(bytearray(data))
            _check_module(exported.mlir_module_serialized, exported)
    except _Refused as exc:
        print("refused " + str(exc).replace("\n", " "))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which makes it one line
        said = str(exc).strip().splitlines()
        print(f"error {type(exc).__name__}: {said[0] if said else ''}")
    else:
        print("ok")


def _module_in_child(data: bytes) -> None:
    """Rules 2-3 in a child process: MLIR's bytecode reader is not hardened against damaged
    input (a flipped bit can crash it), so the module is first read where a crash kills only the
    child; the parent deserializes it (for the call) only after the child found it sound."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["JAX_PLATFORMS"] = "cpu"  # the child reads; it never runs anything
    try:
        proc = subprocess.run(
            [sys.executable, "-P", "-c", _CHILD],
            input=data,
            capture_output=True,
            env=env,
            timeout=CHILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise _Refused(f"the program's module took more than {CHILD_TIMEOUT_S} s to read") from None
    if proc.returncode < 0:
        raise _Refused(f"the program's module crashed the MLIR reader (signal {-proc.returncode})")
    verdict = proc.stdout.decode("utf-8", errors="replace").strip().splitlines()
    line = verdict[-1] if verdict else ""
    if line == "ok" and proc.returncode == 0:
        return
    kind, _, said = line.partition(" ")
    if kind == "refused":
        raise _Refused(said)
    raise _Refused(f"the program's module cannot be read ({show(said or proc.stderr[-200:], 160)})")


def load_exported(data: bytes, conv: Any, manifest: Mapping, label: str) -> Any:
    """``jax.export.deserialize(data)`` once rules 1-3 hold; an InputError (one line) otherwise."""
    import jax

    stderr: list[str] = []
    try:
        with captured_stderr() as stderr:
            _check_convention(conv, manifest)
            _check_flatbuffer(data, conv)
            exported = jax.export.deserialize(bytearray(data))
            _check_exported(exported, conv)
        _module_in_child(data)
    except _Refused as exc:
        raise InputError(str(exc), path=label, where=PAYLOAD, hint=_HINT) from None
    except MconvError:
        raise
    except Exception as exc:  # noqa: BLE001 - anything a damaged file makes the readers raise
        said = (str(exc) or "".join(stderr)).strip().splitlines()
        raise InputError(
            f"cannot be read ({type(exc).__name__}: {show(said[0] if said else '', 120)})",
            path=label,
            where=PAYLOAD,
            hint=_HINT_BAD,
        ) from None
    return exported
