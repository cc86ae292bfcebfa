"""P2 probe: the LeNet-5 pipeline of ``lenet5_compress.py`` stage by stage, with variants.

Runs the same pipeline as ``bench/lenet5_compress.py`` (same model, split, jittered copies, prune
steps, sparsities and bits), but one pass at a time, and prints top-1 agreement with the
uncompressed model on the 450 measuring digits after every stage, so a sweep can see where
agreement is lost. At the end it prints how closely the student fits the teacher on the 1347
fine-tuning digits it was trained on, on their jittered copies and on the 450 measuring digits
(disagreements and logit RMSE), the measuring digits it disagrees on (index: the teacher's
top-1 minus top-2 probability), and the weights.mcw size.

Variants (each was one arm of the sweeps in bench/results/lenet5_sweep_2.md):

- ``--method mag|wanda|obs``: after each prune step, a layer-wise least-squares reconstruction
  (the layer's kept weights and bias re-solved so its outputs on the compressed model's inputs
  match the teacher's, layer by layer in graph order; ``--damp`` adds that fraction of the mean
  Hessian diagonal). ``mag`` keeps the magnitude mask; ``wanda`` re-chooses it by
  |w| * ||x_j|| (Sun et al., 2023); ``obs`` prunes by SparseGPT's OBS update (Frantar and
  Alistarh, 2023) from the dense least-squares solution. ``--ft-lr 0`` skips the masked
  retraining after each step.
- ``--bss N``: boundary samples (Heo et al., 2019): each distillation frame moved by Newton steps
  on its input, through the reference executor's gradient with respect to the input, until the
  teacher's logit margin between its top-1 and its top-(1+k) class is ``--bss-target``, k = 1..N.
- the fine-tuning options of the ``finetune`` pass: ``--schedule``, ``--margin``, ``--loss``,
  ``--T``, ``--batch``, ``--epochs``, ``--cepochs`` (centroid stages), ``--final-lr``, and
  ``--init`` for ``cluster``.

Run: python bench/lenet5_probe.py [--seed 0] [--method none] [--bss 0] [--schedule cosine]
     [--margin 0.3] [--sparsity ip1=0.9] [--bits ip1=5] [--shared ../shared]
     (about 100 s on one core with the defaults)
     python bench/lenet5_probe.py --fragility 0.05   (the teacher's own noise floor, 30 draws)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx_ir as ir
from lenet5_compress import BITS, FINAL_SPARSITY, STEPS, apply_overrides, augment, p2_data
from mlp_compress import biases_to_half

ROOT = Path(__file__).resolve().parent.parent


def layer_rows(node: ir.Node, x: np.ndarray) -> np.ndarray:
    """A layer's input as rows that multiply its flattened weight's rows (im2col for a Conv)."""
    if node.op_type == "Gemm":
        return x.reshape(len(x), -1)
    k = 5  # LeNet-5's kernels; no padding, stride 1
    win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))  # N, C, OH, OW, k, k
    return win.transpose(0, 2, 3, 1, 4, 5).reshape(-1, x.shape[1] * k * k)


def sparsegpt(w: np.ndarray, h: np.ndarray, sparsity: float, d: int, block: int = 128) -> np.ndarray:
    """SparseGPT's column-by-column OBS pruning of ``w`` (rows x columns) for the Hessian ``h``:
    in each block the fraction ``sparsity`` of the smallest w^2 / [H^-1]_ii^2 goes, and each
    pruned column's error is spread over the columns not yet visited. Columns >= ``d`` (the
    bias) are never pruned."""
    w = w.copy()
    hinv = np.linalg.cholesky(np.linalg.inv(h)).T  # upper Cholesky factor of H^-1
    for i1 in range(0, w.shape[1], block):
        i2 = min(i1 + block, w.shape[1])
        w1, q1, err1 = w[:, i1:i2].copy(), np.zeros((len(w), i2 - i1)), np.zeros((len(w), i2 - i1))
        hinv1 = hinv[i1:i2, i1:i2]
        score = w1**2 / np.diag(hinv1)[None, :] ** 2
        score[:, np.arange(i1, i2) >= d] = np.inf
        finite = np.sort(score[np.isfinite(score)])
        k = int(round(finite.size * sparsity))
        pruned = score <= (finite[k - 1] if k else -1.0)
        for i in range(i2 - i1):
            q = np.where(pruned[:, i], 0.0, w1[:, i])
            q1[:, i] = q
            err = (w1[:, i] - q) / hinv1[i, i]
            w1[:, i:] -= err[:, None] * hinv1[i, i:][None, :]
            err1[:, i] = err
        w[:, i1:i2] = q1
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]
    return w


def reconstruct(model: ir.Model, teacher: ir.Model, frames: np.ndarray, method: str, damp: float) -> None:
    """Layer-wise least squares (module docstring, ``--method``), in graph order, in place."""
    from mconv.edit.weights import weight_refs
    from mconv.engines.reference.executor import Executor

    ex_t = Executor(teacher)
    teacher_refs = {r.name: r for r in weight_refs(teacher)}
    for ref in weight_refs(model):
        node = ref.node
        inp, bias = node.inputs[0].name, node.inputs[2].name
        w_t = teacher_refs[ref.name].array().astype(np.float64)
        w_t = w_t.reshape(len(w_t), -1)
        b_t = teacher.graph.initializers[bias].const_value.numpy().astype(np.float64)
        keep = ref.array().reshape(w_t.shape) != 0
        d = w_t.shape[1]
        h, c = np.zeros((d + 1, d + 1)), np.zeros((d + 1, d + 1))
        ex_c = Executor(model)
        for s in range(0, len(frames), 512):
            feed = {"data": frames[s : s + 512]}
            xt = layer_rows(node, ex_t.run(feed, outputs=[inp])[inp]).astype(np.float64)
            xc = layer_rows(node, ex_c.run(feed, outputs=[inp])[inp]).astype(np.float64)
            xt, xc = (np.hstack([x, np.ones((len(x), 1))]) for x in (xt, xc))
            h += xc.T @ xc
            c += xc.T @ xt
        h[np.arange(d), np.arange(d)] += damp * np.mean(np.diag(h))
        rhs = np.hstack([w_t, b_t[:, None]]) @ c.T  # row o: X_c^T X_t theta_t[o]
        if method == "obs":
            new = sparsegpt(np.linalg.solve(h, rhs.T).T, h, 1.0 - keep.mean(), d)
        else:
            if method == "wanda":
                score = np.abs(w_t) * np.sqrt(np.diag(h)[:d])[None, :]
                chosen = np.argsort(-score, axis=None, kind="stable")[: int(keep.sum())]
                keep = np.zeros(score.size, bool)
                keep[chosen] = True
                keep = keep.reshape(score.shape)
            new = np.zeros((len(w_t), d + 1))
            for o in range(len(w_t)):
                cols = np.flatnonzero(np.append(keep[o], True))
                new[o, cols] = np.linalg.solve(h[np.ix_(cols, cols)], rhs[o, cols])
        ref.set_array(new[:, :d].reshape(ref.shape).astype(np.float32))
        model.graph.initializers[bias].const_value = ir.Tensor(new[:, d].astype(np.float32), name=bias)
        print(f"  {method} {ref.name}: kept {np.mean(new[:, :d] != 0):.3f}", flush=True)


def boundary_samples(teacher: ir.Model, frames: np.ndarray, towards: int, target: float) -> np.ndarray:
    """``frames`` moved to where the teacher's logit margin between its top-1 and its
    top-(1+towards) class is ``target`` (4 Newton steps along the margin's input gradient)."""
    from mconv.engines.reference.executor import Executor

    ex = Executor(teacher)
    z = ex.run({"data": frames}, outputs=["ip2"])["ip2"]
    order = np.argsort(-z, axis=1)
    a, b, rows = order[:, 0], order[:, towards], np.arange(len(frames))
    x = frames.astype(np.float32).copy()
    for _ in range(4):
        grads = []
        for s in range(0, len(x), 256):
            cot = np.zeros((len(x[s : s + 256]), z.shape[1]), np.float32)
            cot[np.arange(len(cot)), a[s : s + 256]] = 1.0
            cot[np.arange(len(cot)), b[s : s + 256]] -= 1.0
            grads.append(ex.vjp({"data": x[s : s + 256]}, {"ip2": cot}, ["data"])["data"])
        g = np.concatenate(grads)
        zz = ex.run({"data": x}, outputs=["ip2"])["ip2"]
        step = (zz[rows, a] - zz[rows, b] - target) / (np.sum(g.reshape(len(g), -1) ** 2, axis=1) + 1e-12)
        x = np.clip(x - step[:, None, None, None] * g, 0.0, 1.0)
    zz = ex.run({"data": x}, outputs=["ip2"])["ip2"]
    margin = zz[rows, a] - zz[rows, b]
    print(
        f"boundary samples: margin quantiles 10/50/90% {np.quantile(margin, [0.1, 0.5, 0.9]).round(3)}, "
        f"mean |dx| {np.mean(np.abs(x - frames)):.4f}",
        flush=True,
    )
    return x


def fragility(teacher_files: list[Path], test: dict, eps: float, draws: int = 30) -> None:
    """How often each measuring digit flips when every weight of the teacher is multiplied by
    (1 + eps * N(0, 1)), over ``draws`` seeded draws: a student's noise floor."""
    from mconv.edit.weights import weight_refs
    from mconv.engines.reference.executor import Executor
    from mconv.formats import import_model

    teacher = import_model(teacher_files)
    z = Executor(teacher).run(test, outputs=["ip2"])["ip2"]
    flips, misses = np.zeros(len(z), int), []
    for seed in range(draws):
        noisy, rng = import_model(teacher_files), np.random.default_rng(seed)
        for ref in weight_refs(noisy):
            w = ref.array()
            ref.set_array((w * (1 + eps * rng.standard_normal(w.shape))).astype(np.float32))
        flipped = Executor(noisy).run(test, outputs=["ip2"])["ip2"].argmax(1) != z.argmax(1)
        flips += flipped
        misses.append(int(flipped.sum()))
    print(f"weights x (1 + {eps} N(0,1)), {draws} draws: misses per draw {misses}")
    print("digits that flipped (index: draws): " + " ".join(f"{i}:{flips[i]}" for i in np.flatnonzero(flips)))


def main() -> int:
    from mconv import passes as P
    from mconv.engines.reference.executor import Executor
    from mconv.formats import import_model
    from mconv.passes.pipeline import snapshot_model
    from mconv.targets import get_target

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--shared", type=Path, default=Path(os.environ.get("MCONV_SHARED", ROOT.parent / "shared"))
    )
    ap.add_argument("--method", default="none", choices=["none", "mag", "wanda", "obs"])
    ap.add_argument("--damp", type=float, default=0.01)
    ap.add_argument("--ft-lr", type=float, default=0.001, help="masked retraining lr after each prune step")
    ap.add_argument("--augment", type=int, default=3)
    ap.add_argument("--bss", type=int, default=0)
    ap.add_argument("--bss-target", type=float, default=0.2)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--cepochs", type=int, default=0, help="epochs of the centroid stages (0: --epochs)")
    ap.add_argument("--final-lr", default="0.0003,0.0001")
    ap.add_argument("--schedule", default="cosine", choices=["cosine", "constant"])
    ap.add_argument("--margin", type=float, default=0.3)
    ap.add_argument("--loss", default="kl", choices=["kl", "mse"])
    ap.add_argument("--T", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--init", default="linear")
    ap.add_argument("--sparsity", default="")
    ap.add_argument("--bits", default="")
    ap.add_argument("--fragility", type=float, default=0.0, help="only the teacher's noise floor at this eps")
    args = ap.parse_args()
    sparsity, bits = dict(FINAL_SPARSITY), dict(BITS)
    apply_overrides(sparsity, args.sparsity, float)
    apply_overrides(bits, args.bits, int)
    loaded = p2_data(args.shared)
    if loaded is None:
        return 2
    files, tune_frames, test_frames = loaded.files, loaded.tune_frames, loaded.test_frames
    test = {"data": test_frames}
    if args.fragility:
        fragility(files, test, args.fragility)
        return 0
    teacher = import_model(files)
    reference = Executor(teacher).run(test)["prob"].argmax(1)
    frames = augment(tune_frames, args.augment, seed=args.seed, jitter=0.5)
    if args.bss:
        extra = [boundary_samples(teacher, frames, k, args.bss_target) for k in range(1, args.bss + 1)]
        frames = np.concatenate([frames, *extra])
    tune = {"data": frames}

    def agreement(model: ir.Model) -> float:
        return float(np.mean(Executor(model).run(test)["prob"].argmax(1) == reference))

    def finetune(lr: float, epochs: int) -> str:
        return (
            f"finetune(epochs={epochs},lr={lr},batch_size={args.batch},holdout=0.0,loss={args.loss!r},"
            f"temperature={args.T},schedule={args.schedule!r},margin={args.margin})"
        )

    t0 = time.time()
    model = import_model(files)
    ctx = P.PassContext(data=tune, seed=args.seed, reference_model=snapshot_model(model))
    log = []
    for f in STEPS:
        per_layer = {k: {"sparsity": round(s * f, 4)} for k, s in sparsity.items()}
        model, _ = P.run_pipeline(model, P.parse_spec(f"prune(op_name={per_layer!r})"), ctx)
        log.append(("prune", agreement(model)))
        if args.method != "none":
            reconstruct(model, teacher, frames, args.method, args.damp)
            log.append(("recon", agreement(model)))
        if args.ft_lr:
            model, _ = P.run_pipeline(model, P.parse_spec(finetune(args.ft_lr, args.epochs)), ctx)
            log.append(("ft", agreement(model)))
    palettes = {k: {"bits": b} for k, b in bits.items()}
    model, _ = P.run_pipeline(model, P.parse_spec(f"cluster(init={args.init!r},op_name={palettes!r})"), ctx)
    log.append(("cluster", agreement(model)))
    for lr in (float(x) for x in args.final_lr.split(",")):
        model, _ = P.run_pipeline(model, P.parse_spec(finetune(lr, args.cepochs or args.epochs)), ctx)
    log.append(("centroids", agreement(model)))
    biases_to_half(model)
    log.append(("fp16 biases", agreement(model)))
    with tempfile.TemporaryDirectory() as tmp:
        get_target("cpu").export(model, Path(tmp) / "bundle", {})
        mcw = (Path(tmp) / "bundle" / "weights.mcw").stat().st_size

    def fit(feeds: dict) -> tuple[int, float, np.ndarray, np.ndarray]:
        t = Executor(teacher).run(feeds, outputs=["ip2"])["ip2"]
        s = Executor(model).run(feeds, outputs=["ip2"])["ip2"]
        return int(np.sum(t.argmax(1) != s.argmax(1))), float(np.sqrt(np.mean((t - s) ** 2))), t, s

    parts = [
        ("fine-tuning digits", {"data": tune_frames}),
        ("their copies", {"data": frames[len(tune_frames) :]}),
    ]
    parts.append(("measuring digits", test))
    fits = [(name, len(feeds["data"]), *fit(feeds)) for name, feeds in parts]
    print(
        "fit (disagreements, logit RMSE): "
        + "; ".join(f"{n} {d}/{size}, {e:.3f}" for n, size, d, e, _, _ in fits)
    )
    t, s = fits[-1][4:]
    probs = np.sort(Executor(teacher).run(test)["prob"], axis=1)
    missed = np.flatnonzero(t.argmax(1) != s.argmax(1))
    print(
        "disagreeing digits (index: teacher margin): "
        + " ".join(f"{i}:{probs[i, -1] - probs[i, -2]:.3f}" for i in missed)
    )
    print(
        f"RESULT {' '.join(sys.argv[1:])} | "
        + " ".join(f"{k}={v:.4f}" for k, v in log)
        + f" | weights.mcw {mcw} B | {time.time() - t0:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
