"""Progress on long work (issue 12 item 10): off a terminal a line on stderr every few seconds
with the stage (pass, epoch, metric), done/total and an ETA; on a terminal a bar. Time comes
from a fake clock or a zero interval: no test waits or asserts on timing."""

from __future__ import annotations

import numpy as np
import onnx
from mconv import passes as P
from mconv.cli.app import app
from mconv.cli.output import Out, ProgressState, format_duration
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _progress_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("progress: ")]


def test_format_duration():
    assert [format_duration(s) for s in (0, 42, 65, 3720, None, -1)] == [
        "0s",
        "42s",
        "1m05s",
        "1h02m",
        "?",
        "?",
    ]


def test_eta_follows_the_current_count_and_restarts_with_a_new_total():
    clock = FakeClock()
    st = ProgressState("optimize", 3, clock)
    st.update("pass fold", 0, 3)
    clock.now += 10
    st.update("pass prune", 1, 3)
    assert st.eta() == 20.0  # 1 of 3 in 10 s: 2 left
    # a fine-tune's step count replaces the pass count: the rate starts again
    st.update("pass 3/3 finetune: epoch 1/4", 0, 100)
    assert st.eta() is None
    clock.now += 30
    st.update("pass 3/3 finetune: epoch 2/4, loss 0.5", 25, 100)
    assert st.eta() == 90.0
    line = st.line()
    assert line == (
        "progress: optimize: pass 3/3 finetune: epoch 2/4, loss 0.5 | 25/100 (25%) | elapsed 40s, ETA 1m30s"
    )


def test_off_a_terminal_a_line_every_interval(capsys):
    clock = FakeClock()
    out = Out(tty=False, clock=clock, interval=5.0)
    with out.progress("verify", total=8) as bar:
        for i in range(8):
            clock.now += 2.0  # a run every 2 s: a line at 6 s, 12 s (after runs 3 and 6)
            bar.advance(1)
            bar(description=f"reference run {i + 1}")
    lines = _progress_lines(capsys.readouterr().err)
    assert len(lines) == 2, lines
    assert lines[0].startswith("progress: verify:") and "3/8 (38%)" in lines[0] and "ETA 10s" in lines[0]
    assert "6/8 (75%)" in lines[1] and "elapsed 12s" in lines[1]


def test_short_work_prints_no_progress_line(capsys):
    clock = FakeClock()
    out = Out(tty=False, clock=clock, interval=5.0)
    with out.progress("export cpu") as bar:
        clock.now += 1.0
        bar("writing", 1, 2)
    assert _progress_lines(capsys.readouterr().err) == []


def test_quiet_prints_no_progress(capsys):
    out = Out(quiet=True, tty=False, interval=0.0)
    with out.progress("optimize", total=2) as bar:
        bar("pass fold", 1, 2)
        bar.advance(1)
    assert capsys.readouterr().err == ""


def test_on_a_terminal_a_bar_takes_the_same_updates(capsys):
    out = Out(tty=True, interval=0.0)
    with out.progress("optimize", total=3) as bar:
        bar("pass fold", 0, 3)
        bar("pass 2/3 finetune: epoch 1/2", 4, 10)  # a new total: the bar restarts its count
        bar.advance(1)
        bar(info="loss 0.3")
    assert _progress_lines(capsys.readouterr().err) == []  # a bar, not lines


def _mlp(path, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["y"], name="fc", transB=1)],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(w, "w")],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _data(path, seed: int = 0, n: int = 32):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    np.savez(path, x=x, labels=rng.integers(0, 3, n))
    return path


def test_pass_context_shows_a_pass_inside_its_pipeline_stage(tmp_path):
    from mconv.irio import load_onnx

    model = load_onnx(_mlp(tmp_path / "m.onnx"))
    rng = np.random.default_rng(1)
    data = {"x": rng.standard_normal((32, 4)).astype(np.float32), "labels": rng.integers(0, 3, 32)}
    calls = []
    ctx = P.PassContext(data=data, progress=lambda d, c, t: calls.append((d, c, t)))
    P.run_pipeline(model, P.parse_spec("dce,finetune(epochs=2,batch_size=8,holdout=0.25)"), ctx)
    assert ("pass dce", 0, 2) in calls and ("pass finetune", 1, 2) in calls  # the pipeline's ticks
    steps = [c for c in calls if c[0].startswith("pass 2/2 finetune: epoch ")]
    assert steps and all(t == 6 for _, _, t in steps)  # 2 epochs of 3 batches (24 samples)
    assert [c for _, c, _ in steps][-1] == 6
    assert any("epoch 2/2, loss " in d and "accuracy" in d for d, _, _ in steps)


def test_cli_fine_tune_off_a_terminal_prints_pass_epoch_and_eta(tmp_path):
    m = _mlp(tmp_path / "m.onnx")
    d = _data(tmp_path / "d.npz")
    spec = "finetune(epochs=3,batch_size=8,holdout=0.25)"
    r = CliRunner(env={"MCONV_PROGRESS_INTERVAL": "0"}).invoke(
        app, ["optimize", str(m), "--passes", spec, "--data", str(d), "-o", str(tmp_path / "o.onnx")]
    )
    assert r.exit_code == 0, r.output
    lines = _progress_lines(r.stderr)
    assert lines, r.stderr
    stepped = [ln for ln in lines if "pass 1/1 finetune: epoch " in ln]
    assert stepped and all("ETA " in ln and "elapsed " in ln for ln in stepped)
    assert any("epoch 3/3" in ln and "/9 (" in ln for ln in stepped)
    assert "9/9 (100%)" in stepped[-1]
    r = CliRunner(env={"MCONV_PROGRESS_INTERVAL": "0"}).invoke(
        app,
        ["optimize", str(m), "--passes", spec, "--data", str(d), "-o", str(tmp_path / "o.onnx"), "--json"],
    )
    assert r.exit_code == 0 and r.stdout.lstrip().startswith("{")  # progress never on stdout
    assert "progress:" not in r.stdout


def test_cli_verify_over_many_batches_reports_each_run(tmp_path):
    m = _mlp(tmp_path / "m.onnx")
    fixed = onnx.load(m)
    for v in (*fixed.graph.input, *fixed.graph.output):
        v.type.tensor_type.shape.dim[0].dim_value = 2  # a fixed batch of 2: 8 samples are 4 runs
    onnx.save(fixed, tmp_path / "fixed.onnx")
    r = CliRunner(env={"MCONV_PROGRESS_INTERVAL": "0"}).invoke(
        app, ["verify", str(tmp_path / "fixed.onnx"), str(tmp_path / "fixed.onnx"), "--samples", "8"]
    )
    assert r.exit_code == 0, r.output
    lines = _progress_lines(r.stderr)
    assert any("verify: reference, 4 run(s)" in ln and "/8 (" in ln for ln in lines), r.stderr
    assert any("verify: candidate, 4 run(s)" in ln and "8/8 (100%)" in ln for ln in lines), r.stderr


def test_cli_without_the_setting_prints_no_line_for_quick_work(tmp_path):
    m = _mlp(tmp_path / "m.onnx")
    r = CliRunner(env={"MCONV_PROGRESS_INTERVAL": "3600"}).invoke(app, ["verify", str(m), str(m)])
    assert r.exit_code == 0, r.output
    assert _progress_lines(r.stderr) == []


# ----------------------------------------------------------------------------- issue 44 item 3


def test_a_line_comes_every_interval_even_when_the_work_makes_no_update():
    from mconv.cli.output import ProgressLines

    clock, written = FakeClock(), []
    lines = ProgressLines("optimize deep-compression", None, clock, 10.0, written.append)
    lines.update("attempt 1/8 [2/18] masked retraining 1: pass finetune: epoch 3/20", 56, 480)
    assert written == []  # nothing before 10 s of (fake) time
    clock.now += 9.9
    assert not lines.poll() and written == []
    clock.now += 0.1  # 10 s since the start, no update since: the heartbeat's poll writes
    assert lines.poll()
    assert written == [
        "progress: optimize deep-compression: attempt 1/8 [2/18] masked retraining 1: pass finetune: "
        "epoch 3/20 | 56/480 (12%) | elapsed 10s, ETA ?"
    ]
    clock.now += 5
    assert not lines.poll()  # the next one 10 s after the last, not sooner
    clock.now += 5
    lines.update(completed=104)  # 48 more steps in the 10 s since the count of 480 started... at 56
    assert len(written) == 2 and "104/480 (22%)" in written[1] and "elapsed 20s" in written[1]


def test_the_eta_is_what_is_left_at_the_rate_of_the_current_count():
    clock = FakeClock()
    st = ProgressState("optimize", None, clock)
    st.update("epoch 1/20", 0, 480)
    clock.now += 12.0
    st.update("epoch 2/20", 48, 480)  # 48 steps in 12 s: 4 steps a second, 432 left
    assert st.eta() == 108.0
    clock.now += 8.0  # no step for 8 s: the rate falls, the ETA grows
    assert st.eta() == 432 * 20.0 / 48
    assert st.line().endswith("| 48/480 (10%) | elapsed 20s, ETA 3m00s")


def test_the_heartbeat_is_off_with_a_fake_clock(capsys):
    clock = FakeClock()
    out = Out(tty=False, clock=clock, interval=10.0)
    with out.progress("analyze", total=4) as bar:
        bar("layer conv1", 1, 4)
        clock.now += 10.0
        bar("layer conv2", 2, 4)
    lines = _progress_lines(capsys.readouterr().err)
    assert lines == ["progress: analyze: layer conv2 | 2/4 (50%) | elapsed 10s, ETA 10s"]
