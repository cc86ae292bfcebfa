"""Spec strings take bare words as strings (issue 13 item 8): ``cluster(bits=4,init=optimal)``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from mconv import passes as P
from mconv.cli.app import app
from mconv.errors import InputError
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner


def _config(spec: str):
    (item,) = P.parse_spec(spec)
    return item.resolve()


@pytest.mark.parametrize(
    ("bare", "quoted"),
    [
        ("cluster(bits=4,init=optimal)", "cluster(bits=4,init='optimal')"),
        ("cluster(init=kmeans++)", "cluster(init='kmeans++')"),  # '+' belongs to the word
        ("prune(scope=global, sparsity=0.5)", "prune(scope='global', sparsity=0.5)"),  # a keyword
        ("prune(structured=none)", "prune(structured='none')"),  # a word, not None
        ("fp16(mode=all, block_list=[Softmax, Exp])", "fp16(mode='all', block_list=['Softmax', 'Exp'])"),
        ("cluster(skip=true)", "cluster(skip=True)"),  # true/false as in TOML recipes
        ("cluster(skip=false, bits = 3)", "cluster(skip=False, bits=3)"),
    ],
)
def test_a_bare_word_is_the_quoted_string(bare, quoted):
    assert _config(bare) == _config(quoted)


def test_quoted_strings_numbers_and_literals_parse_as_before():
    cfg = _config("prune(sparsity=9e-1,threshold_std=None,scope='layer',on_unsafe=\"skip\")")
    assert (cfg.sparsity, cfg.threshold_std, cfg.scope, cfg.on_unsafe) == (0.9, None, "layer", "skip")
    cfg = _config("prune(sparsity=+0.5e+0)")  # a number with an exponent is no word
    assert cfg.sparsity == 0.5
    # commas and '=' inside quotes belong to the string
    (item,) = P.parse_spec("fp16(block_list=['a,b', \"c=d\", 'it\\'s'])")
    assert item.config["block_list"] == ["a,b", "c=d", "it's"]
    # dicts: bare keys are strings too
    (item,) = P.parse_spec("prune(op_type={Conv: {sparsity: 0.6}})")
    assert item.op_type == {"Conv": {"sparsity": 0.6}}
    assert _config("cluster(bits=0x4)").bits == 4


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("cluster(bits=four)", "'bits' must be an integer, got 'four'"),
        ("prune(sparsity=half)", "'sparsity' must be a number, got 'half'"),
        ("cluster(skip=yes)", "'skip' must be true or false, got 'yes'"),
        ("cluster(init=optimum)", "'init' is 'optimum'"),
        ("cluster(init=open(0))", "option 'init' is not a literal"),
    ],
)
def test_a_bare_word_where_it_does_not_fit_names_the_option(spec, fragment):
    with pytest.raises(InputError) as info:
        P.parse_spec(spec)[0].resolve()
    assert fragment in str(info.value)
    assert info.value.hint


def _model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 16)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["y"], name="fc", transB=1)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        [numpy_helper.from_array(w, "w")],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_cli_takes_bare_words_and_refuses_a_word_for_a_number_in_one_line(tmp_path):
    model = _model(tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    r = CliRunner().invoke(
        app, ["optimize", str(model), "--passes", "cluster(bits=2,init=linear)", "-o", str(out), "-q"]
    )
    assert r.exit_code == 0, r.output
    w = onnx.numpy_helper.to_array(onnx.load(out).graph.initializer[0])
    assert np.unique(w).size <= 4  # clustered to 2 bits

    bad = tmp_path / "bad.onnx"
    r = CliRunner().invoke(app, ["optimize", str(model), "--passes", "cluster(bits=two)", "-o", str(bad)])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert "'bits' must be an integer, got 'two'" in lines[0] and "Traceback" not in r.output
    assert not bad.exists()
