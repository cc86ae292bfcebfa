"""The fuzzer's surfaces beyond the readers: code in files, bundles that carry code, and the paths
commands write to. Builders for bench/fuzz_corpus.py, same entry records, same canaries.

Groups (each a ``--formats`` name of bench/fuzz.py):

- ``torchscript-code``: TorchScript archives whose code touches files: ``torch.from_file`` in
  ``forward``, in ``__setstate__`` (runs inside ``torch.jit.load``), in a submodule, and reading
  the canary into a constant (``shared=False``); each through ``import`` and ``inspect``.
  Success is exit 2 with no ``PWNED*`` file made and no canary byte in any output.
- ``metal-bundle``, ``xla-bundle``, ``webgpu-bundle``: a real bundle of the digits MLP (seeds,
  mutated with the manifest re-signed) and hostile ones: C++ with a static initializer that
  runs ``system()`` and an ``#include`` of the canary in ``kernels.metal``; a ``model.jax_export``
  holding a host callback custom call; WGSL with text that is not mconv's; each re-signed as an
  attacker would, run through ``run`` and ``verify``.
- ``outputs``: ``-o`` naming a folder of the user's files, the input itself (plainly, through a
  symlink, a hard link), or a folder holding the input; the user's files are hashed as inputs,
  so a deleted or changed one is "input touched".
- ``sharded``: a two-shard safetensors checkpoint streamed through ``cluster``: ``-o`` the
  checkpoint folder or its index, a shard that is a symlink to the canary, an index that is a
  FIFO (made when the case is prepared).
- ``data``: ``--data`` with NaN and Inf, labels out of range or fractional, for ``finetune`` and
  the ``blockwise`` GPTQ pass.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DIGITS = REPO / "fixtures" / "digits_mlp.onnx"


def _export(c, fmt: str, name: str, target: str):
    """A real bundle of the digits MLP for ``target`` in a new entry folder, and its input."""
    from mconv.cli.app import app

    d = c.entry_dir(fmt, name)
    shutil.copyfile(DIGITS, d / "model.onnx")
    try:
        app(
            ["export", str(d / "model.onnx"), "-o", str(d / "bundle"), "--target", target, "--quiet"],
            standalone_mode=False,
        )
    except SystemExit:
        pass
    np.save(d / "x.npy", np.random.default_rng(11).random((1, 64)).astype(np.float32) * 16)
    return d


def _bundle_files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in (d / "bundle").rglob("*") if p.is_file())


def _run_argv() -> list[str]:
    return ["run", "{D}/bundle", "-i", "input={D}/x.npy", "-o", "{D}/out/y.npz", "--json"]


def _verify_argv() -> list[str]:
    return ["verify", "{D}/model.onnx", "{D}/bundle", "--samples", "2", "--json"]


def _bundle_group(c, fmt: str, target: str, mutate_suffixes: tuple[str, ...], hostile: dict) -> None:
    from fuzz_corpus import _resign

    d = _export(c, fmt, "digits", target)
    files = _bundle_files(d)
    mutate = [i for i, f in enumerate(files) if f.endswith(mutate_suffixes)]
    for verb, argv in (("run", _run_argv()), ("verify", _verify_argv())):
        c.add(
            fmt, f"digits_{verb}", "seed", [*files, "model.onnx", "x.npy"], argv, mutate=mutate, resign=True
        )
        c.entries[-1]["dir"] = f"seeds/{fmt}__digits"
    for name, edit in hostile.items():
        for verb, argv in (("run", _run_argv()), ("verify", _verify_argv())):
            hd = c.entry_dir(fmt, f"hostile_{name}_{verb}")
            shutil.copytree(d, hd, dirs_exist_ok=True)
            edit(hd / "bundle")
            _resign(hd / "bundle")
            c.add(fmt, f"hostile_{name}_{verb}", "hostile", [*_bundle_files(hd), "model.onnx", "x.npy"], argv)


# --- TorchScript code ---------------------------------------------------------------------------


def build_torchscript_code(c) -> None:
    import torch

    torch.manual_seed(0)
    args = ["--input-shape", "x=1,4"]

    class Writes(torch.nn.Module):
        def forward(self, x):
            t = torch.from_file("PWNED_ts_forward", shared=True, size=16, dtype=torch.uint8)
            return x + t[:4].to(torch.float32)

    class Reads(torch.nn.Module):
        def forward(self, x):
            t = torch.from_file("../canary", shared=False, size=64, dtype=torch.uint8)
            return x + t[:4].to(torch.float32)

    class SetState(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.ones(4)

        def forward(self, x):
            return x * self.w

        @torch.jit.export
        def __getstate__(self):
            return (self.w, self.training)

        @torch.jit.export
        def __setstate__(self, state: tuple[torch.Tensor, bool]):
            # used, or TorchScript's compiler drops the call as dead code
            t = torch.from_file("PWNED_ts_setstate", shared=True, size=16, dtype=torch.uint8)
            self.w = state[0] + t[:4].to(torch.float32)
            self.training = state[1]

    class Inner(torch.nn.Module):
        def forward(self, x):
            return x + torch.from_file("PWNED_ts_sub", shared=True, size=16, dtype=torch.float32)[:4]

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return torch.relu(self.inner(x))

    for name, cls in (
        ("forward", Writes),
        ("reads_canary", Reads),
        ("setstate", SetState),
        ("submodule", Outer),
    ):
        d = c.entry_dir("torchscript-code", f"hostile_{name}")
        torch.jit.save(torch.jit.script(cls().eval()), str(d / "m.pt"))
        imp = ["import", "{D}/m.pt", "-o", "{D}/out/out.onnx", "--json", *args]
        c.add("torchscript-code", f"hostile_{name}", "hostile", ["m.pt"], imp)
        d2 = c.entry_dir("torchscript-code", f"hostile_{name}_inspect")
        shutil.copyfile(d / "m.pt", d2 / "m.pt")
        c.add(
            "torchscript-code",
            f"hostile_{name}_inspect",
            "hostile",
            ["m.pt"],
            ["inspect", "{D}/m.pt", "--json"],
        )

    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return torch.softmax(self.fc(x), -1)

    d = c.entry_dir("torchscript-code", "plain")
    torch.jit.save(torch.jit.script(Plain().eval()), str(d / "m.pt"))
    c.add(
        "torchscript-code",
        "plain",
        "seed",
        ["m.pt"],
        ["import", "{D}/m.pt", "-o", "{D}/out/out.onnx", "--json", *args],
    )


# --- bundles that carry code ---------------------------------------------------------------------


def build_metal_bundle(c) -> None:
    canary = str(c.root / "cases" / "canary")
    pwned = str(c.root / "cases" / "PWNED_metal_system")

    def kernels(b: Path) -> Path:
        return next(b.rglob("kernels.metal"))

    def system_call(b: Path) -> None:
        k = kernels(b)
        k.write_text(
            k.read_text() + f'\n#include <cstdlib>\nstatic int mconv_pwn = std::system("touch {pwned}");\n'
        )

    def include_canary(b: Path) -> None:
        k = kernels(b)
        k.write_text(f'#include "{canary}"\n' + k.read_text())

    _bundle_group(
        c,
        "metal-bundle",
        "metal",
        ("manifest.json", "metal_plan.json", "kernels.metal", "weights.mcw"),
        {"system": system_call, "include_canary": include_canary},
    )


def host_callback_module(data: bytes, index: int = 999999) -> bytes:
    """``data`` (a serialized ``jax.export.Exported``) with its main function's first result passed
    through a ``stablehlo.custom_call`` to jax's CPU host-callback target with a callback ``index``
    no process has: what a hand-edited bundle can hold (jax checks custom-call targets only when it
    exports)."""
    import dataclasses
    import re

    from jax import export as jexport
    from jax._src.export import _export
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    exp = jexport.deserialize(bytearray(data))
    text = exp.mlir_module()
    lines = [ln for ln in text.splitlines() if not ln.startswith("#loc")]
    text = re.sub(r" loc\((?:[^()]|\([^()]*\))*\)", "", "\n".join(lines))
    # the main function's return: "return %a, %b : tensor<...>, tensor<...>"
    m = re.search(r"func\.func public @main.*?\n(\s+)return (%[\w#]+)(.*?) : (tensor<[^>]*>)", text, re.S)
    assert m, "no main return found"
    indent, first, rest, ty = m.group(1), m.group(2), m.group(3), m.group(4)
    call = (
        f"{indent}%mconv_evil = stablehlo.custom_call @xla_ffi_python_cpu_callback({first}) "
        f"{{api_version = 4 : i32, backend_config = {{index = {index} : ui64}}, has_side_effect = true}} "
        f": ({ty}) -> {ty}\n"
    )
    head = text[: m.start(1)]
    tail = text[m.start(1) :].replace(f"return {first}{rest}", f"return %mconv_evil{rest}", 1)
    with mlir.make_ir_context(), ir.Location.unknown():
        module = ir.Module.parse(head + call + tail)
        ser = _export._module_to_bytecode(module)
    return bytes(dataclasses.replace(exp, mlir_module_serialized=ser).serialize())


def build_xla_bundle(c) -> None:
    def callback(b: Path) -> None:
        target = next(b.rglob("model.jax_export"))
        target.write_bytes(host_callback_module(target.read_bytes()))

    _bundle_group(c, "xla-bundle", "xla", ("manifest.json", "xla.json", "model.jax_export", "weights.mcw"),
                  {"host_callback": callback})  # fmt: skip


def build_webgpu_bundle(c) -> None:
    def foreign_wgsl(b: Path) -> None:
        for p in b.rglob("*.wgsl"):
            p.write_text(p.read_text().replace("fn ", "fn /* not mconv's */ ", 1))
        for p in b.rglob("*.js"):
            p.write_text("globalThis.PWNED = 1;\n" + p.read_text())

    def nested_plan(b: Path) -> None:
        p = next(b.rglob("webgpu_plan.json"))
        p.write_text('{"layers":' + "[" * 50000 + "]" * 50000 + "}")

    _bundle_group(
        c,
        "webgpu-bundle",
        "webgpu",
        ("manifest.json", "webgpu_plan.json", ".wgsl", "weights.mcw"),
        {"foreign_text": foreign_wgsl, "nested_plan": nested_plan},
    )


# --- output paths --------------------------------------------------------------------------------


def _user_folder(d: Path, with_model: bool = True) -> list[str]:
    (d / "models" / "photos").mkdir(parents=True)
    (d / "models" / "thesis.txt").write_text("four years of work\n")
    (d / "models" / "photos" / "a.jpg").write_bytes(b"\xff\xd8\xff\xe0" + bytes(range(256)) * 8)
    files = ["models/thesis.txt", "models/photos/a.jpg"]
    if with_model:
        shutil.copyfile(DIGITS, d / "models" / "model.onnx")
        files.append("models/model.onnx")
    return files


def build_outputs(c) -> None:
    from safetensors.numpy import save

    def entry(name: str, argv: list[str], extra=None) -> None:
        d = c.entry_dir("outputs", f"hostile_{name}")
        files = _user_folder(d)
        if extra:
            files += extra(d)
        c.add("outputs", f"hostile_{name}", "hostile", files, argv)

    for target in ("cpu", "xla", "metal", "webgpu", "weights"):
        entry(f"export_{target}_into_user_folder",
              ["export", "{D}/models/model.onnx", "-o", "{D}/models", "--target", target, "--json"])  # fmt: skip
    entry(
        "export_beside_into_parent",
        ["export", "{D}/models/model.onnx", "-o", "{D}", "--target", "cpu", "--json"],
    )
    entry(
        "optimize_onto_input",
        ["optimize", "{D}/models/model.onnx", "--passes", "fold", "-o", "{D}/models/model.onnx"],
    )
    entry("import_onto_input", ["import", "{D}/models/model.onnx", "-o", "{D}/models/model.onnx"])

    def link(d: Path) -> list[str]:
        os.symlink("models/model.onnx", d / "alias.onnx")
        os.link(d / "models" / "model.onnx", d / "hard.onnx")
        return ["hard.onnx"]

    entry(
        "optimize_onto_symlink",
        ["optimize", "{D}/models/model.onnx", "--passes", "fold", "-o", "{D}/alias.onnx"],
        link,
    )
    entry(
        "optimize_onto_hardlink",
        ["optimize", "{D}/models/model.onnx", "--passes", "fold", "-o", "{D}/hard.onnx"],
        link,
    )
    c.entries[-1]["hardlinks"] = [["models/model.onnx", "hard.onnx"]]  # copying a case loses the link
    entry(
        "optimize_into_user_folder",
        ["optimize", "{D}/models/model.onnx", "--passes", "fold", "-o", "{D}/models"],
    )

    def st(d: Path) -> list[str]:
        rng = np.random.default_rng(3)
        (d / "models" / "w.safetensors").write_bytes(
            save({"fc.weight": rng.standard_normal((16, 32)).astype(np.float32)})
        )
        return ["models/w.safetensors"]

    entry("stream_into_user_folder",
          ["optimize", "{D}/models/w.safetensors", "--passes", "cluster(bits=4)", "-o", "{D}/models"], st)  # fmt: skip
    entry("stream_onto_input",
          ["optimize", "{D}/models/w.safetensors", "--passes", "cluster(bits=4)", "-o", "{D}/models/w.safetensors"], st)  # fmt: skip
    d = c.entry_dir("outputs", "export_fresh")
    files = _user_folder(d)
    c.add("outputs", "export_fresh", "seed", files,
          ["export", "{D}/models/model.onnx", "-o", "{D}/out/bundle", "--target", "cpu", "--json"], mutate=[2])  # fmt: skip


# --- sharded checkpoints -------------------------------------------------------------------------


def _sharded(d: Path, folder: str = "ckpt") -> list[str]:
    from safetensors.numpy import save

    rng = np.random.default_rng(5)
    ck = d / folder
    ck.mkdir()
    shards = {
        "model-00001-of-00002.safetensors": {"a.weight": rng.standard_normal((32, 16)).astype(np.float32)},
        "model-00002-of-00002.safetensors": {"b.weight": rng.standard_normal((16, 32)).astype(np.float32)},
    }
    weight_map = {}
    for name, arrays in shards.items():
        (ck / name).write_bytes(save(arrays))
        weight_map.update({k: name for k in arrays})
    (ck / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return [f"{folder}/{n}" for n in [*shards, "model.safetensors.index.json"]]


def build_sharded(c) -> None:
    cluster = ["--passes", "cluster(bits=4)"]
    d = c.entry_dir("sharded", "two_shards")
    files = _sharded(d)
    c.add("sharded", "two_shards", "seed", files,
          ["optimize", "{D}/ckpt", *cluster, "-o", "{D}/out/ck"], mutate=[0, 2])  # fmt: skip

    def hostile(name: str, argv: list[str], edit=None, fifos=()) -> None:
        hd = c.entry_dir("sharded", f"hostile_{name}")
        hfiles = _sharded(hd)
        if edit:
            hfiles = edit(hd, hfiles)
        c.add("sharded", f"hostile_{name}", "hostile", hfiles, argv)
        c.entries[-1]["fifos"] = list(fifos)

    hostile("output_is_input_folder", ["optimize", "{D}/ckpt", *cluster, "-o", "{D}/ckpt"])
    hostile(
        "output_is_index", ["optimize", "{D}/ckpt", *cluster, "-o", "{D}/ckpt/model.safetensors.index.json"]
    )
    hostile("output_inside_input", ["optimize", "{D}/ckpt", *cluster, "-o", "{D}/ckpt/sub"])

    def file_out(hd: Path, files: list[str]) -> list[str]:
        (hd / "notes.txt").write_text("mine\n")
        return [*files, "notes.txt"]

    hostile("output_is_a_file", ["optimize", "{D}/ckpt", *cluster, "-o", "{D}/notes.txt"], file_out)

    def shard_symlink(hd: Path, files: list[str]) -> list[str]:
        (hd / "ckpt" / "model-00002-of-00002.safetensors").unlink()
        os.symlink("../../canary", hd / "ckpt" / "model-00002-of-00002.safetensors")
        return [f for f in files if not f.endswith("00002.safetensors")]

    hostile("shard_symlink_outside", ["optimize", "{D}/ckpt", *cluster, "-o", "{D}/out/ck"], shard_symlink)

    def fifo_index(hd: Path, files: list[str]) -> list[str]:
        (hd / "ckpt" / "model.safetensors.index.json").unlink()
        return [f for f in files if not f.endswith(".index.json")]

    hostile("index_fifo", ["optimize", "{D}/ckpt", *cluster, "-o", "{D}/out/ck"], fifo_index,
            fifos=["ckpt/model.safetensors.index.json"])  # fmt: skip


# --- calibration data ----------------------------------------------------------------------------


def build_data(c) -> None:
    digits = np.load(REPO / "fixtures" / "digits_train.npz")
    x = digits["images"][:64].reshape(64, 64).astype(np.float32)
    y = digits["labels"][:64].astype(np.int64)
    finetune = ["--passes", "prune(sparsity=0.5),finetune(epochs=1)"]
    gptq = ["--passes", "blockwise(bits=4,block=32,method='gptq')"]

    def entry(name: str, arrays: dict, passes: list[str], kind: str = "hostile") -> None:
        d = c.entry_dir("data", name)
        shutil.copyfile(DIGITS, d / "model.onnx")
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        (d / "d.npz").write_bytes(buf.getvalue())
        argv = [
            "optimize",
            "{D}/model.onnx",
            *passes,
            "--data",
            "{D}/d.npz",
            "-o",
            "{D}/out/m.onnx",
            "--json",
        ]
        c.add("data", name, kind, ["model.onnx", "d.npz"], argv, mutate=[1])

    entry("finetune", {"input": x, "labels": y}, finetune, kind="seed")
    nan, inf = x.copy(), x.copy()
    nan[3, 14] = np.nan
    inf[5, 2] = -np.inf
    entry("hostile_nan_finetune", {"input": nan, "labels": y}, finetune)
    entry("hostile_inf_gptq", {"input": inf}, gptq)
    entry("hostile_nan_gptq", {"input": nan}, gptq)
    entry("hostile_label_huge", {"input": x, "labels": np.where(np.arange(64) == 7, 10**12, y)}, finetune)
    entry("hostile_label_negative", {"input": x, "labels": np.where(np.arange(64) == 9, -1, y)}, finetune)
    entry("hostile_label_fractional", {"input": x, "labels": y.astype(np.float32) + 0.5}, finetune)


BUILDERS = {
    "torchscript-code": [build_torchscript_code],
    "metal-bundle": [build_metal_bundle],
    "xla-bundle": [build_xla_bundle],
    "webgpu-bundle": [build_webgpu_bundle],
    "outputs": [build_outputs],
    "sharded": [build_sharded],
    "data": [build_data],
}
