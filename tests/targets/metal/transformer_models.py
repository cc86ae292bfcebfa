"""Builders for the transformer and data-dependent op tests of the metal and webgpu targets.

A BERT-style encoder and a Llama-style decoder (2 layers, vocabulary 3000: token ids beyond
half's exact integers) built with torch and exported by torch.onnx.export; small ONNX graphs
for IsNaN/IsInf, Clip with tensor bounds, Gather with runtime indices and an If whose condition
comes from the input. ``close`` is the gate: cosine AND max error relative to the output's scale.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import onnx_ir as ir
from mconv.irio import from_proto
from onnx import TensorProto, helper, numpy_helper

VOCAB = 3000
SEQ = 16


def close(ref: np.ndarray, got: np.ndarray, rel: float, cos_min: float = 0.9999) -> None:
    """``got`` agrees with ``ref``: same shape, cosine >= ``cos_min`` and max abs error within
    ``rel`` of the output's scale (max |ref|): a uniform scale error fails the second."""
    ref = np.asarray(ref, np.float64)
    got = np.asarray(got, np.float64)
    assert ref.shape == got.shape, (ref.shape, got.shape)
    scale = max(float(np.abs(ref).max()), 1e-12)
    err = float(np.abs(ref - got).max())
    denom = float(np.linalg.norm(ref) * np.linalg.norm(got))
    cos = float((ref * got).sum() / denom) if denom else float(np.array_equal(ref, got))
    assert cos >= cos_min and err <= rel * scale, (
        f"cosine {cos:.7f}, max error {err:.3g} of scale {scale:.3g}"
    )


def token_ids(seed: int = 0) -> np.ndarray:
    """Ids over the whole vocabulary, with 2047, 2049, 2999 (half holds 2049 as 2048) and 0."""
    ids = np.random.default_rng(seed).integers(0, VOCAB, (1, SEQ)).astype(np.int64)
    ids[0, :4] = [2999, 2049, 2047, 0]
    return ids


def _torch_models():
    import torch

    nn, F = torch.nn, torch.nn.functional

    class BertLayer(nn.Module):
        def __init__(self, d: int, h: int) -> None:
            super().__init__()
            self.h = h
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.f1, self.f2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x, bias):
            b, t, d = x.shape

            def heads(z):
                return z.view(b, t, self.h, d // self.h).transpose(1, 2)

            q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.h) + bias, -1) @ v
            x = self.ln1(x + self.o(a.transpose(1, 2).reshape(b, t, d)))
            return self.ln2(x + self.f2(F.gelu(self.f1(x))))

    class Bert(nn.Module):
        """BERT's embeddings (token, position, type), attention mask from an input, pooler."""

        def __init__(self, d: int = 64, h: int = 4, layers: int = 2) -> None:
            super().__init__()
            self.tok, self.pos, self.typ = nn.Embedding(VOCAB, d), nn.Embedding(64, d), nn.Embedding(2, d)
            self.ln = nn.LayerNorm(d)
            self.layers = nn.ModuleList(BertLayer(d, h) for _ in range(layers))
            self.pool = nn.Linear(d, d)

        def forward(self, ids, mask):
            x = self.ln(
                self.tok(ids) + self.pos(torch.arange(ids.shape[1])) + self.typ(torch.zeros_like(ids))
            )
            bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
            for layer in self.layers:
                x = layer(x, bias)
            return x, torch.tanh(self.pool(x[:, 0]))

    class RMSNorm(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return self.w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def rope(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

    class LlamaLayer(nn.Module):
        def __init__(self, d: int, h: int, kv: int) -> None:
            super().__init__()
            self.h, self.kv, hd = h, kv, d // h
            self.q = nn.Linear(d, d, bias=False)
            self.k, self.v = nn.Linear(d, kv * hd, bias=False), nn.Linear(d, kv * hd, bias=False)
            self.o = nn.Linear(d, d, bias=False)
            self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
            self.g, self.u = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, 3 * d, bias=False)
            self.down = nn.Linear(3 * d, d, bias=False)

        def forward(self, x, cos, sin):
            b, t, d = x.shape
            hd = d // self.h
            y = self.n1(x)
            q = rope(self.q(y).view(b, t, self.h, hd).transpose(1, 2), cos, sin)
            k = rope(self.k(y).view(b, t, self.kv, hd).transpose(1, 2), cos, sin)
            v = self.v(y).view(b, t, self.kv, hd).transpose(1, 2)
            k, v = k.repeat_interleave(self.h // self.kv, 1), v.repeat_interleave(self.h // self.kv, 1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
            y = self.n2(x)
            return x + self.down(F.silu(self.g(y)) * self.u(y))

    class Llama(nn.Module):
        """Llama's decoder: RMSNorm, rotary positions, grouped-query causal attention, SwiGLU."""

        def __init__(self, d: int = 64, h: int = 4, kv: int = 2, layers: int = 2) -> None:
            super().__init__()
            hd = d // h
            self.emb = nn.Embedding(VOCAB, d)
            self.layers = nn.ModuleList(LlamaLayer(d, h, kv) for _ in range(layers))
            self.norm, self.head = RMSNorm(d), nn.Linear(d, VOCAB, bias=False)
            inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
            self.register_buffer("inv", inv, persistent=False)

        def forward(self, ids):
            f = torch.outer(torch.arange(ids.shape[1]).float(), self.inv)
            e = torch.cat((f, f), -1)
            x = self.emb(ids)
            for layer in self.layers:
                x = layer(x, e.cos(), e.sin())
            return self.head(self.norm(x))

    return torch, Bert, Llama


def export_transformers(folder: Path) -> dict[str, Path]:
    """The BERT-style (inputs ids, mask) and Llama-style (ids) models as ONNX files in
    ``folder``, exported by torch's TorchScript-based exporter (opset 17)."""
    torch, Bert, Llama = _torch_models()
    torch.manual_seed(0)
    ids = torch.from_numpy(token_ids())
    mask = torch.ones(1, SEQ, dtype=torch.long)
    paths = {"bert": folder / "bert.onnx", "llama": folder / "llama.onnx"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Bert().eval(), (ids, mask), str(paths["bert"]), input_names=["ids", "mask"],
            output_names=["hidden", "pooled"], dynamo=False, opset_version=17,
        )  # fmt: skip
        torch.onnx.export(
            Llama().eval(), (ids,), str(paths["llama"]), input_names=["ids"], output_names=["logits"],
            dynamo=False, opset_version=17,
        )  # fmt: skip
    return paths


def transformer_feeds(name: str) -> dict[str, np.ndarray]:
    feeds = {"ids": token_ids(1)}
    if name == "bert":
        mask = np.ones((1, SEQ), np.int64)
        mask[0, 12:] = 0  # padding: the mask reaches the attention at run time
        feeds["mask"] = mask
    return feeds


def onnx_model(nodes, inputs, outputs, inits=(), opset: int = 17) -> ir.Model:
    """A model from helper nodes; ``inputs``/``outputs`` are (name, TensorProto type, shape)."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(a, k) for k, a in inits],
    )
    return from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


def embedding_model(vocab: int, d: int = 8) -> tuple[ir.Model, np.ndarray]:
    """Gather(table, ids) with ids an int64 input [2, 5]: a token embedding alone; and the table."""
    table = np.random.default_rng(vocab).standard_normal((vocab, d)).astype(np.float32)
    node = helper.make_node("Gather", ["table", "ids"], ["y"], name="embed")
    model = onnx_model(
        [node], [("ids", TensorProto.INT64, [2, 5])], [("y", TensorProto.FLOAT, None)], [("table", table)]
    )
    return model, table


def special_values_model() -> ir.Model:
    """IsNaN, IsInf (both signs, and positive only) of x -> float 0/1 outputs, and Clip(x, lo, hi)
    with lo and hi inputs (an audio front end's computed bounds)."""
    nodes = [
        helper.make_node("IsNaN", ["x"], ["nan_b"], name="isnan"),
        helper.make_node("IsInf", ["x"], ["inf_b"], name="isinf"),
        helper.make_node("IsInf", ["x"], ["pinf_b"], name="ispinf", detect_negative=0),
        helper.make_node("Cast", ["nan_b"], ["nan"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["inf_b"], ["inf"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["pinf_b"], ["pinf"], to=TensorProto.FLOAT),
        helper.make_node("Clip", ["x", "lo", "hi"], ["clipped"], name="clip_both"),
        helper.make_node("Clip", ["x", "", "hi"], ["clipped_hi"], name="clip_hi"),
    ]
    return onnx_model(
        nodes,
        [("x", TensorProto.FLOAT, [3, 4]), ("lo", TensorProto.FLOAT, []), ("hi", TensorProto.FLOAT, [])],
        [(n, TensorProto.FLOAT, None) for n in ("nan", "inf", "pinf", "clipped", "clipped_hi")],
    )


def data_if_model(big_branch: bool = False) -> ir.Model:
    """A wake-word gate: If(ReduceMean(x) > 0) then Relu(x) * 2 else Neg(x) - 1, the condition
    from the input. ``big_branch``: the then branch holds 80 nodes (too costly to run both)."""
    then_nodes = [helper.make_node("Relu", ["x"], ["t0"]), helper.make_node("Mul", ["t0", "two"], ["t_out"])]
    if big_branch:
        then_nodes = [helper.make_node("Relu", ["x"], ["t0"])] + [
            helper.make_node("Mul", [f"t{i}", "two"], [f"t{i + 1}"]) for i in range(79)
        ]
        then_nodes.append(helper.make_node("Identity", ["t79"], ["t_out"]))
    then_g = helper.make_graph(
        then_nodes, "then", [], [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [2, 6])],
        [numpy_helper.from_array(np.float32(2.0), "two")],
    )  # fmt: skip
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e0"]), helper.make_node("Sub", ["e0", "one"], ["e_out"])],
        "else", [], [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [2, 6])],
        [numpy_helper.from_array(np.float32(1.0), "one")],
    )  # fmt: skip
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0),
        helper.make_node("Greater", ["m", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], name="gate", then_branch=then_g, else_branch=else_g),
        helper.make_node("Sigmoid", ["y"], ["p"]),
    ]
    return onnx_model(
        nodes,
        [("x", TensorProto.FLOAT, [2, 6])],
        [("p", TensorProto.FLOAT, None)],
        [("zero", np.float32(0.0))],
    )
