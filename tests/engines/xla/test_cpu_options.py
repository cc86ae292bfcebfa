"""XLA on the CPU (issue 15 item 3): programs are compiled with the YNNPACK fusions off
(mconv.engines.xla.jit), which jaxlib 0.10 builds around a chain of dots and the Softmax after it and runs
10-25x slower; a user's XLA_FLAGS naming the option wins. Checked on the compiled program's
text, not by timing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from mconv.engines.xla import jit as runtime
from mconv.irio import from_proto
from onnx import TensorProto, helper, numpy_helper


def classifier(x, a, b):
    return jax.nn.softmax(jnp.matmul(jax.nn.relu(jnp.matmul(x, a)), b), axis=1)


def _args():
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(np.float32) for s in ((8, 256), (256, 128), (128, 10))]


def _fused(fn) -> bool:
    return '"kind":"__ynn_fusion"' in fn.lower(*_args()).compile().as_text()  # the fusion's config


def test_the_runtimes_jit_compiles_no_ynn_fusion():
    assert not _fused(runtime.jit(classifier))
    if runtime.compiler_options() is None:  # a jaxlib without the option: nothing to turn off
        assert not _fused(jax.jit(classifier))
    else:
        assert runtime.compiler_options() == {"xla_cpu_experimental_ynn_fusion_type": ""}
    got = np.asarray(runtime.jit(classifier)(*_args()))
    want = np.asarray(jax.jit(classifier)(*_args()))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_a_users_xla_flags_naming_the_option_win(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.setattr(runtime, "_OPTIONS", [])
    plain = runtime.compiler_options()
    monkeypatch.setattr(runtime, "_OPTIONS", [])
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT")
    assert runtime.compiler_options() is None
    monkeypatch.setattr(runtime, "_OPTIONS", [])
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")  # another flag: ours still apply
    assert runtime.compiler_options() == plain


def _gemm_softmax_proto() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("Gemm", ["x", "w1"], ["h"], name="fc1", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w2"], ["z"], name="fc2", transB=1),
        helper.make_node("Softmax", ["z"], ["p"], name="softmax", axis=1),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((128, 256)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((10, 128)).astype(np.float32), "w2"),
    ]
    graph = helper.make_graph(
        nodes,
        "clf",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 256])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("where", ["bundle", "engine"])
def test_the_bundle_and_the_engine_compile_with_the_options(tmp_path, where):
    model = from_proto(_gemm_softmax_proto())
    x = np.random.default_rng(2).standard_normal((8, 256)).astype(np.float32)
    seen: list[dict | None] = []
    real = jax.jit

    def spy(fn, **kwargs):
        seen.append(kwargs.get("compiler_options"))
        return real(fn, **kwargs)

    from mconv.targets import get_target

    if where == "bundle":
        get_target("xla").export(model, tmp_path / "b", {"platforms": ["cpu"]})
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(runtime.jax, "jit", spy)
            runner = get_target("xla").load(str(tmp_path / "b"))
        got = runner.run({"x": x})["p"]
    else:
        from mconv.engines.xla.engine import XlaEngine

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(runtime.jax, "jit", spy)
            engine = XlaEngine(model, ["p"])
        got = engine.run({"x": x})["p"]
    assert seen and seen[-1] == runtime.compiler_options()
    assert got.shape == (8, 10) and np.allclose(got.sum(1), 1.0, atol=1e-5)
