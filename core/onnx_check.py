"""Checks of an ONNX model's structure, sizes and external data at load, before anything reads.

``mconv.irio.load_onnx`` runs :func:`check_model` on the parsed (not yet deserialized) protobuf.
Every failure is one :class:`~mconv.errors.InputError` naming the model file, the place (graph,
node, tensor) and the names involved, escaped with :func:`~mconv.errors.show`.

Rules:
1. Text: every string field of the model is UTF-8 (protobuf hands invalid UTF-8 back as bytes,
   which nothing downstream can write back).
2. Tensors (initializers of every graph, Constant/attribute tensors, sparse tensors, function
   bodies, training graphs): a known dtype (not UNDEFINED), dims >= 0, exactly one data source
   (raw_data, the typed field of its dtype, or external data) whose size is what dtype and dims
   need: raw bytes ``ceil(n * bits / 8)``, typed elements ``n`` (2n for complex, packed bytes
   for sub-byte types). Only field lengths are compared; no value is read.
3. External data: ``location`` is a relative path without NUL that, with every symlink resolved,
   names a readable regular file inside the model's folder with one hard link (onnx_ir refuses
   to map hard-linked files); ``offset``/``length`` are decimal integers, ``length`` is the
   tensor's size and ``offset + size`` lies inside the file; each key appears once. The location
   is then rewritten to the resolved path relative to the folder, so later reads follow no
   symlink. Each data file is opened once (non-blocking: a FIFO cannot hang the load).
4. Graphs: inputs, initializers and node outputs are named once each (SSA; an initializer may
   also be listed as an input), every non-empty node input is defined in the graph or an
   enclosing one (If/Loop/Scan bodies see outer names; "" is an absent optional input), graph
   outputs are defined in their graph, the nodes have no cycle (a subgraph's use of an outer
   value counts as an input of the node that holds it; nodes need not be sorted). Graph inputs
   carry a known element type. Model-local functions are checked the same way.
5. Sparse initializers are checked, then refused: onnx_ir drops them, which would leave their
   users reading nothing.
6. Unknown ops and domains are not checked: other parts of mconv report unsupported ops.

Cost: one pass over the structure, one ``stat``/``open`` per external data file.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Collection
from typing import NoReturn

import onnx
import onnx_ir as ir
from google.protobuf.descriptor import FieldDescriptor
from mconv.errors import InputError, show

_KNOWN_DTYPES = frozenset(int(d) for d in ir.DataType if d != ir.DataType.UNDEFINED) & frozenset(
    onnx.TensorProto.DataType.values()
)
_KNOWN_ATTR_TYPES = frozenset(onnx.AttributeProto.AttributeType.values()) - {0}
_TYPED_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")
_TYPE_STRING, _TYPE_MESSAGE = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE
_FIELD_KINDS: dict = {}  # field descriptor -> (type, repeated)
_DECIMAL = re.compile(r"[0-9]{1,19}")
_EXTERNAL = onnx.TensorProto.EXTERNAL
_STRING = onnx.TensorProto.STRING
_HINT = "the model is invalid; re-export it"
_EXT_HINT = "external data must be a readable file inside the model's folder, named by a relative path"


def check_model(
    proto: onnx.ModelProto,
    *,
    path: str | os.PathLike,
    folder: str | os.PathLike,
    provided: Collection[str] = (),
) -> None:
    """Check ``proto`` (parsed from ``path``, external data not loaded) as the module doc says.

    ``folder`` is the directory that external data locations are relative to; nothing outside
    it may be named. ``provided`` names values the main graph may use without defining them (a
    bundle's weightless ``model.onnx``: the weights live in ``weights.mcw``). Rewrites checked
    external locations in place (resolved, relative)."""
    _Checker(path, folder, frozenset(provided)).model(proto)


def _where(trail: tuple) -> str:
    """Trail items are formatted only when a check fails: a literal string, a node
    ``(NodeProto, index)`` or ``(kind, name, index)``."""
    parts = []
    for item in trail:
        if isinstance(item, str):
            parts.append(item)
        elif isinstance(item[0], onnx.NodeProto):
            parts.append(f"node {_node_label(*item)}")
        else:
            kind, name, index = item
            if not isinstance(name, (str, type(None))):  # a message: its name, if it has one
                name = _name(name)
            parts.append(f"{kind} '{show(name)}'" if name else kind if index is None else f"{kind} #{index}")
    return " > ".join(parts)


def _dims_text(dims) -> str:
    return show(str(list(dims)), 60)


class _Checker:
    def __init__(self, path, folder, provided: frozenset[str] = frozenset()) -> None:
        self.provided = provided
        self.path = str(path)
        self.folder = os.path.realpath(folder)
        self.model_file = os.path.realpath(path)
        self.files: dict[str, int] = {}  # resolved data file -> size

    def fail(self, message: str, trail: tuple, hint: str = _HINT) -> NoReturn:
        raise InputError(message, path=self.path, where=_where(trail) or None, hint=hint)

    # ----------------------------------------------------------------------------------- model
    def model(self, proto: onnx.ModelProto) -> None:
        self.strings(proto, ("model",))
        graph = proto.graph
        self.graph(graph, [set(self.provided)] if self.provided else None, (("graph", graph.name, None),))
        for i, func in enumerate(proto.functions):
            self.function(func, (("function", f"{func.domain}::{func.name}", i),))
        for i, info in enumerate(proto.training_info):
            for part in ("initialization", "algorithm"):
                if info.HasField(part):
                    self.graph_tensors(getattr(info, part), (f"training_info[{i}].{part}",))

    # --------------------------------------------------------------------------------- strings
    def strings(self, msg, trail: tuple) -> None:
        """Every string field under ``msg`` is text (invalid UTF-8 comes back as bytes)."""
        if type(msg) is onnx.TensorProto:  # ListFields would copy raw_data
            self.tensor_strings(msg, trail)
            return
        for fd, value in msg.ListFields():
            kind = _FIELD_KINDS.get(fd)
            if kind is None:
                kind = _FIELD_KINDS[fd] = (fd.type, fd.is_repeated)
            if kind[0] == _TYPE_STRING:
                for i, text in enumerate(value if kind[1] else (value,)):
                    if type(text) is not str:
                        label = f"{fd.name}[{i}]" if kind[1] else fd.name
                        self.fail(f"{label} is not valid UTF-8 ('{show(text)}')", trail)
            elif kind[0] == _TYPE_MESSAGE:
                if kind[1]:
                    for i, sub in enumerate(value):
                        self.strings(sub, (*trail, (fd.name, sub, i)))
                else:
                    self.strings(value, (*trail, (fd.name, value, None)))

    def tensor_strings(self, t: onnx.TensorProto, trail: tuple) -> None:
        for name in ("name", "doc_string"):
            text = getattr(t, name)
            if not isinstance(text, str):
                self.fail(f"tensor {name} is not valid UTF-8 ('{show(text)}')", trail)
        for entries, what in ((t.external_data, "external data"), (t.metadata_props, "metadata")):
            for entry in entries:
                for part in (entry.key, entry.value):
                    if not isinstance(part, str):
                        self.fail(
                            f"{what} of tensor '{show(t.name)}' is not valid UTF-8 ('{show(part)}')",
                            trail,
                            _EXT_HINT if entries is t.external_data else _HINT,
                        )

    # ---------------------------------------------------------------------------------- graphs
    def graph(self, g: onnx.GraphProto, outer: list[set[str]] | None, trail: tuple) -> set[str]:
        """Check ``g``; return the names it uses from enclosing graphs."""
        inputs: set[str] = set()
        for i, v in enumerate(g.input):
            at = (*trail, ("input", v.name, i))
            if not v.name:
                self.fail(f"graph input #{i} has no name", at)
            if v.name in inputs:
                self.fail(f"graph input '{show(v.name)}' is listed twice", at)
            inputs.add(v.name)
            self.value_type(v.type, at, v.name, required=outer is None, is_input=True)
        inits: set[str] = set()
        for i, t in enumerate(g.initializer):
            at = (*trail, ("initializer", t.name, i))
            if not t.name:
                self.fail(f"initializer #{i} has no name", at)
            if t.name in inits:
                self.fail(f"initializer '{show(t.name)}' is defined twice", at)
            inits.add(t.name)
            self.tensor(t, at)
        for i, s in enumerate(g.sparse_initializer):
            name = s.values.name
            at = (*trail, ("sparse initializer", name, i))
            if not name:
                self.fail(f"sparse initializer #{i} has no name", at)
            if name in inits:
                self.fail(f"initializer '{show(name)}' is defined twice", at)
            inits.add(name)
            self.sparse(s, at)
        here = inputs | inits
        free = self.body(g.node, here, outer, trail)
        for i, v in enumerate(g.output):
            at = (*trail, ("output", v.name, i))
            if not v.name:
                self.fail(f"graph output #{i} has no name", at)
            if v.name not in here:
                self.fail(
                    f"graph output '{show(v.name)}' is not produced by any node, input or initializer", at
                )
            self.value_type(v.type, at, v.name)
        for v in g.value_info:
            self.value_type(v.type, (*trail, ("value_info", v.name, None)), v.name)
        for i, s in enumerate(g.sparse_initializer):  # onnx_ir would drop them, leaving their users dangling
            self.fail(
                f"sparse initializer '{show(s.values.name)}' is not supported",
                (*trail, ("sparse initializer", s.values.name, i)),
                "store it as a dense initializer",
            )
        return free

    def function(self, f: onnx.FunctionProto, trail: tuple) -> None:
        here: set[str] = set()
        for name in f.input:
            if not name or name in here:
                self.fail(f"function input '{show(name)}' is empty or listed twice", trail)
            here.add(name)
        self.body(f.node, here, None, trail)
        for name in f.output:
            if name not in here:
                self.fail(f"function output '{show(name)}' is not produced by any node or input", trail)
        for a in f.attribute_proto:
            self.attribute(a, (*trail, ("attribute", a.name, None)), [here])

    def body(self, nodes, here: set[str], outer: list[set[str]] | None, trail: tuple) -> set[str]:
        """SSA, defined inputs and no cycle for ``nodes``; adds their outputs to ``here``.
        Returns the names used from enclosing scopes."""
        nodes = list(nodes)
        inputs = [n.input for n in nodes]
        producer: dict[str, int] = {}
        for k, n in enumerate(nodes):
            for name in n.output:
                if not name:
                    continue
                if name in here:
                    first = producer.get(name)
                    what = (
                        "a graph input or initializer"
                        if first is None
                        else f"node {_node_label(nodes[first], first)}"
                    )
                    self.fail(
                        f"value '{show(name)}' is defined twice (by node {_node_label(n, k)} and by {what}); "
                        "ONNX graphs are single-assignment",
                        (*trail, (n, k)),
                    )
                here.add(name)
                producer[name] = k
        scope = [here, *(outer or [])]
        free: set[str] = set()
        deps: list[set[int]] = []
        for k, n in enumerate(nodes):
            mine: set[int] = set()
            for name in inputs[k]:
                if name in producer:
                    mine.add(producer[name])
                elif name and name not in here:  # "" is an absent optional input
                    if not (outer and any(name in s for s in outer)):
                        self.fail(
                            f"input '{show(name)}' of node {_node_label(n, k)} is not defined by any graph input, "
                            "initializer or node output",
                            (*trail, (n, k)),
                        )
                    free.add(name)
            attributes = n.attribute
            if attributes:
                at = (*trail, (n, k))
                seen_attrs: set[str] = set()
                for a in attributes:
                    if a.name in seen_attrs:
                        self.fail(f"node {_node_label(n, k)} has attribute '{show(a.name)}' twice", at)
                    seen_attrs.add(a.name)
                    # A subgraph's names from outside it were found in ``scope``: here or further out.
                    for name in self.attribute(a, (*at, ("attribute", a.name, None)), scope):
                        if name in producer:
                            mine.add(producer[name])
                        elif name not in here:
                            free.add(name)
            if not n.op_type:
                self.fail(f"node {_node_label(n, k)} has no op_type", (*trail, (n, k)))
            deps.append(mine)
        self.acyclic(nodes, deps, trail)
        return free

    def acyclic(self, nodes, deps: list[set[int]], trail: tuple) -> None:
        """Kahn's algorithm; on a cycle, name the nodes of one."""
        users: list[list[int]] = [[] for _ in deps]
        waiting = [len(d) for d in deps]
        for k, d in enumerate(deps):
            for j in d:
                users[j].append(k)
        ready = [k for k, w in enumerate(waiting) if w == 0]
        done = 0
        while ready:
            k = ready.pop()
            done += 1
            for u in users[k]:
                waiting[u] -= 1
                if waiting[u] == 0:
                    ready.append(u)
        if done == len(deps):
            return
        left = {k for k, w in enumerate(waiting) if w}
        k, index = min(left), {}
        order: list[int] = []
        while k not in index:  # every node left has a dependency left: walk back until one repeats
            index[k] = len(order)
            order.append(k)
            k = min(j for j in deps[k] if j in left)
        cycle = order[index[k] :][::-1]
        path = " -> ".join(f"node {_node_label(nodes[j], j)}" for j in cycle[:4])
        path += " -> ..." if len(cycle) > 4 else ""
        self.fail(
            f"the graph has a cycle: {path} -> node {_node_label(nodes[cycle[0]], cycle[0])}",
            (*trail, (nodes[cycle[0]], cycle[0])),
            "ONNX graphs must be acyclic; re-export the model",
        )

    def attribute(self, a: onnx.AttributeProto, at: tuple, scope: list[set[str]]) -> list[str]:
        """Check one attribute; return the outer names its subgraphs use."""
        if not a.name:
            self.fail("attribute has no name", at)
        if a.type == 0 and not a.ref_attr_name:
            self.fail(f"attribute '{show(a.name)}' has no type (UNDEFINED)", at)
        if a.type not in _KNOWN_ATTR_TYPES and a.type != 0:
            self.fail(f"attribute '{show(a.name)}' has unknown type {a.type}", at)
        if a.HasField("t"):
            self.tensor(a.t, at)
        for t in a.tensors:
            self.tensor(t, at)
        if a.HasField("sparse_tensor"):
            self.sparse(a.sparse_tensor, at)
        for s in a.sparse_tensors:
            self.sparse(s, at)
        if a.HasField("tp"):
            self.value_type(a.tp, at, a.name)
        for tp in a.type_protos:
            self.value_type(tp, at, a.name)
        free: list[str] = []
        for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            free += sorted(self.graph(g, scope, (*at, ("graph", g.name, None))))
        return free

    def graph_tensors(self, g: onnx.GraphProto, trail: tuple) -> None:
        """Only the tensors of ``g`` (training graphs refer to the main graph's names)."""
        for t in g.initializer:
            self.tensor(t, (*trail, ("initializer", t.name, None)))
        for s in g.sparse_initializer:
            self.sparse(s, (*trail, ("sparse initializer", s.values.name, None)))
        for k, n in enumerate(g.node):
            for a in n.attribute:
                at = (*trail, (n, k), ("attribute", a.name, None))
                for t in ([a.t] if a.HasField("t") else []) + list(a.tensors):
                    self.tensor(t, at)
                for s in ([a.sparse_tensor] if a.HasField("sparse_tensor") else []) + list(a.sparse_tensors):
                    self.sparse(s, at)
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    self.graph_tensors(sub, (*at, ("graph", sub.name, None)))

    # ----------------------------------------------------------------------------------- types
    def value_type(
        self, tp: onnx.TypeProto, at, name: str, *, required: bool = False, is_input: bool = False
    ):
        kind = tp.WhichOneof("value")
        if kind is None:
            if required:
                self.fail(
                    f"graph input '{show(name)}' has no type", at, "give every graph input a tensor type"
                )
            return
        if kind in ("tensor_type", "sparse_tensor_type"):
            elem = getattr(tp, kind).elem_type
            if elem == 0 and is_input:
                self.fail(
                    f"graph input '{show(name)}' has dtype UNDEFINED (0)",
                    at,
                    "give every graph input an element type",
                )
            if elem != 0 and elem not in _KNOWN_DTYPES:
                self.fail(f"value '{show(name)}' has unknown dtype number {elem}", at)
        elif kind in ("sequence_type", "optional_type"):
            inner = getattr(tp, kind)
            if inner.HasField("elem_type"):
                self.value_type(inner.elem_type, at, name, is_input=is_input)
        elif kind == "map_type":
            if tp.map_type.key_type not in _KNOWN_DTYPES:
                self.fail(f"value '{show(name)}' has unknown map key dtype {tp.map_type.key_type}", at)
            if tp.map_type.HasField("value_type"):
                self.value_type(tp.map_type.value_type, at, name, is_input=is_input)

    # --------------------------------------------------------------------------------- tensors
    def sparse(self, s: onnx.SparseTensorProto, at: tuple) -> None:
        name = show(s.values.name)
        self.tensor(s.values, (*at, "values"))
        self.tensor(s.indices, (*at, "indices"))
        dims = list(s.dims)
        if any(d < 0 for d in dims):
            self.fail(f"sparse tensor '{name}' has a negative dimension in dims {_dims_text(dims)}", at)
        if len(s.values.dims) != 1:
            self.fail(f"sparse tensor '{name}' values must be 1-D, got dims {_dims_text(s.values.dims)}", at)
        nnz = s.values.dims[0]
        if s.indices.data_type != onnx.TensorProto.INT64 or list(s.indices.dims) not in (
            [nnz],
            [nnz, len(dims)],
        ):
            self.fail(
                f"sparse tensor '{name}' indices must be INT64 of dims [{nnz}] or [{nnz}, {len(dims)}], "
                f"got dims {_dims_text(s.indices.dims)}",
                at,
            )

    def tensor(self, t: onnx.TensorProto, at: tuple) -> None:
        label = f"tensor '{show(t.name)}'"
        dt = t.data_type
        if dt == 0:
            self.fail(
                f"{label} has dtype UNDEFINED (0)", at, "set the tensor's data_type; re-export the model"
            )
        if dt not in _KNOWN_DTYPES:
            self.fail(f"{label} has unknown dtype number {dt}", at)
        dims = list(t.dims)
        if any(d < 0 for d in dims):
            self.fail(f"{label} has a negative dimension in dims {_dims_text(dims)}", at)
        n = math.prod(dims)
        dtype = ir.DataType(dt)

        def kind() -> str:
            return f"{label} ({dtype.name} {_dims_text(dims)})"

        nbytes = None if dt == _STRING else (n * dtype.bitwidth + 7) // 8
        typed = [(name, len(getattr(t, name))) for name in _TYPED_FIELDS if len(getattr(t, name))]
        has_raw = t.HasField("raw_data")
        if t.data_location not in (onnx.TensorProto.DEFAULT, _EXTERNAL):
            self.fail(f"{label} has unknown data_location {t.data_location}", at)
        if t.data_location == _EXTERNAL:
            if has_raw or typed:
                self.fail(f"{label} is marked external but also holds data in the model file", at)
            if nbytes is None:
                self.fail(f"{label} is a STRING tensor marked external (strings cannot be external)", at)
            self.external(t, at, label, kind, nbytes)
            return
        if int(has_raw) + len(typed) > 1:
            fields = (["raw_data"] if has_raw else []) + [name for name, _ in typed]
            self.fail(f"{label} holds data in more than one field ({', '.join(fields)})", at)
        if has_raw:
            if nbytes is None:
                self.fail(f"{label} is a STRING tensor with raw_data (strings go in string_data)", at)
            size = len(t.raw_data)
            if size != nbytes:
                self.fail(f"{kind()} needs {nbytes} bytes but its raw_data holds {size}", at)
        elif typed:
            name, count = typed[0]
            want_field = onnx.helper.tensor_dtype_to_field(dt)
            if name != want_field:
                self.fail(f"{label} holds {dtype.name} data in {name} (expected {want_field})", at)
            if nbytes is not None and dtype.bitwidth < 8:
                want = nbytes  # sub-byte types: one packed byte per int32_data element
            elif dt in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
                want = 2 * n
            else:
                want = n
            if count != want:
                self.fail(f"{kind()} needs {want} values in {name} but holds {count}", at)
        elif n:
            self.fail(f"{kind()} has no data", at)

    def external(self, t: onnx.TensorProto, at, label: str, kind, nbytes: int) -> None:
        entries: dict[str, onnx.StringStringEntryProto] = {}
        for entry in t.external_data:
            if entry.key in entries:
                self.fail(f"{label} gives external data key '{show(entry.key)}' twice", at, _EXT_HINT)
            entries[entry.key] = entry
        if "location" not in entries or not entries["location"].value:
            self.fail(f"{label} is marked external but has no location", at, _EXT_HINT)
        location = entries["location"].value
        shown = f"{label}: external data location '{show(location)}'"
        if "\x00" in location:
            self.fail(f"{shown} holds a NUL character", at, _EXT_HINT)
        if os.path.isabs(location):
            self.fail(f"{shown} is an absolute path", at, _EXT_HINT)
        offset, length = (self.decimal(entries, key, shown, at) for key in ("offset", "length"))
        target = os.path.realpath(os.path.join(self.folder, location))
        if target == self.folder:
            self.fail(f"{shown} is a directory", at, _EXT_HINT)
        if os.path.commonpath([self.folder, target]) != self.folder:
            self.fail(
                f"{shown} is outside the model's folder",
                at,
                "external data must lie inside the model's folder, symlinks resolved; "
                "copy the model and its data into one folder (cp -L)",
            )
        size = self.data_file(target, shown, at)
        offset = offset or 0
        span = nbytes if length is None else length
        if offset + span > size:
            self.fail(
                f"{shown} runs past the end of the file: offset {offset} + {span} bytes > {size} bytes",
                at,
                "the external data file is truncated or does not belong to this model",
            )
        if length is not None and length != nbytes:
            # The lazy loader's references into the model file itself stand for its raw_data.
            held = "raw_data holds" if target == self.model_file else "external data length is"
            self.fail(f"{kind()} needs {nbytes} bytes but its {held} {length}", at, _HINT)
        entries["location"].value = os.path.relpath(target, self.folder)

    def decimal(self, entries, key: str, shown: str, at) -> int | None:
        if key not in entries:
            return None
        text = entries[key].value
        if not _DECIMAL.fullmatch(text):
            self.fail(f"{shown}: {key} '{show(text)}' is not a non-negative integer", at, _EXT_HINT)
        return int(text)

    def data_file(self, target: str, shown: str, at) -> int:
        """The size of the regular file ``target``, opened once (non-blocking) to prove it reads."""
        if target in self.files:
            return self.files[target]
        try:
            st = os.stat(target)
        except FileNotFoundError:
            self.fail(f"{shown}: the file does not exist", at, "copy the external data file beside the model")
        except OSError as exc:
            self.fail(
                f"{shown}: the file cannot be read ({exc.strerror or type(exc).__name__})", at, _EXT_HINT
            )
        if stat.S_ISDIR(st.st_mode):
            self.fail(f"{shown} is a directory", at, _EXT_HINT)
        if not stat.S_ISREG(st.st_mode):
            self.fail(f"{shown} is not a regular file", at, _EXT_HINT)
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(target, flags)
            try:
                st = os.fstat(fd)
                if stat.S_ISREG(st.st_mode) and st.st_size:
                    os.pread(fd, 1, 0)
            finally:
                os.close(fd)
        except OSError as exc:
            self.fail(
                f"{shown}: the file cannot be read ({exc.strerror or type(exc).__name__})", at, _EXT_HINT
            )
        if not stat.S_ISREG(st.st_mode):
            self.fail(f"{shown} is not a regular file", at, _EXT_HINT)
        if st.st_nlink > 1:
            self.fail(
                f"{shown}: the file has {st.st_nlink} hard links (onnx_ir will not map it)",
                at,
                "copy the external data file so that it has a single link",
            )
        self.files[target] = st.st_size
        return st.st_size


def _node_label(n: onnx.NodeProto, k: int) -> str:
    name = f"'{show(n.name)}'" if n.name else f"#{k}"
    return f"{name} ({show(n.op_type)})"


def _name(msg) -> str | None:
    name = getattr(msg, "name", None) if "name" in msg.DESCRIPTOR.fields_by_name else None
    return name if isinstance(name, str) else None
