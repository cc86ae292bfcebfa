"""Seeded mutation fuzzing of every mconv reader through the real CLI (issue 11, item 16).

    python bench/fuzz.py [--cases 2000] [--formats onnx,npz] [--jobs 2] [--seed 0]
                         [--out bench/results/fuzz.md] [--log bench/results/fuzz_failures.log]
    python bench/fuzz.py --replay 'onnx#123 seed=0'   # one case again, with its full output

Seeds are real files (../shared/models) and files bench/fuzz_corpus.py builds (in a separate
process, before anything here starts a thread pool); the hostile corpus is run once per entry.
Each case is a child forked from this process after every reader is imported (so a case costs
milliseconds, not an interpreter start), with RLIMIT_AS (4 GiB) and a wall-time limit. The child
writes its input files into ``ROOT/cases/<format>-<n>/``, chdirs there and calls the CLI's
``app`` in-process; stdout and stderr go to files. Outcomes:

- ``exit2``: exit 2 with exactly one line on stderr, ``error: ...``, no traceback;
- ``valid``: exit 0, and no output (files written, stdout, stderr) holds the canary marker
  planted beside and above the inputs (else ``leak``);
- ``exit3`` (internal error), ``timeout``, ``memory`` (MemoryError/bad_alloc under the limit, or
  killed by SIGKILL without our timeout), ``code`` (a file that a pickle, model code, a bundle's
  C++ or anything else from a file would have created, ``PWNED*``, exists), ``touched`` (a file
  of the case folder outside ``out/`` changed or vanished: an input, or the user's files an
  output path named), ``other`` (a multi-line message, another exit code, a signal).

Surfaces beyond the readers (bench/fuzz_surfaces.py): TorchScript code, metal/xla/webgpu bundles,
output paths, sharded checkpoints and calibration data. Cases of the surfaces that start engines
with threads (``EXEC_FORMATS``) exec ``python -m mconv`` in the forked child instead of calling
the CLI in-process.

Every case is deterministic in (seed, format, n); failing cases are logged one per line in the
form ``--replay`` takes. The case folders and the corpus live in a temp dir removed at the end
(``--keep`` keeps it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

# One thread per case (--jobs runs cases side by side), and no thread pool in the forking parent:
# set before numpy (OpenBLAS) or torch (OpenMP) is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("KERAS_BACKEND", "jax")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MEM_LIMIT = 4 << 30
TIME_LIMIT = 20.0
CLASSES = ("exit2", "valid", "exit3", "timeout", "memory", "leak", "code", "touched", "other")
FORMATS = (
    "onnx",
    "onnx-extdata",
    "keras-h5",
    "keras-json",
    "keras-zip",
    "caffe",
    "tflite",
    "torch",
    "dlk-json",
    "safetensors",
    "npz",
    "tf-checkpoint",
    "bundle",
    "torchscript-code",
    "metal-bundle",
    "xla-bundle",
    "webgpu-bundle",
    "outputs",
    "sharded",
    "data",
)
# surfaces whose commands start engines with threads (jax, wgpu, a compiler): each case execs a
# fresh interpreter (``python -m mconv``) rather than running in a child forked from a parent
# whose engine already holds threads and locks
EXEC_FORMATS = ("metal-bundle", "xla-bundle", "webgpu-bundle", "outputs")
MEMORY_MARKERS = ("MemoryError", "bad_alloc", "Unable to allocate", "Cannot allocate memory", "out of memory")


# --- mutations -------------------------------------------------------------------------------------


def _position(rng: np.random.Generator, n: int) -> int:
    """Headers and footers hold the structure: a third of positions near each end, a third anywhere."""
    if n <= 1:
        return 0
    r = rng.random()
    if r < 0.35:
        return int(rng.integers(0, min(n, 512)))
    if r < 0.55:
        return int(rng.integers(max(0, n - 512), n))
    return int(rng.integers(0, n))


def plan_mutations(rng: np.random.Generator, n: int) -> list[tuple]:
    """1-3 edits of a file of ``n`` bytes, as plain tuples (printable, replayable)."""
    edits = []
    for _ in range(int(rng.choice([1, 1, 1, 2, 3]))):
        kind = str(rng.choice(["truncate", "flip", "overwrite", "overwrite", "insert", "duplicate"]))
        p = _position(rng, n)
        if kind == "truncate":
            edits.append(("truncate", p))
            n = p
        elif kind == "flip":
            edits.append(("flip", p, int(rng.integers(1, 9)), int(rng.integers(0, 2**31))))
        elif kind == "overwrite":
            fill = str(rng.choice(["00", "ff", "rand", "int"]))
            edits.append(("overwrite", p, int(rng.integers(1, 9)), fill, int(rng.integers(0, 2**31))))
        elif kind == "insert":
            k = int(rng.choice([1, 2, 4, 8, 64, 512]))
            edits.append(("insert", p, k, int(rng.integers(0, 2**31))))
            n += k
        else:
            a = _position(rng, n)
            k = int(rng.integers(1, max(2, min(4096, n // 2 + 1))))
            edits.append(("duplicate", a, k, p))
            n += min(k, max(0, n - a))
    return edits


def apply_mutations(data: bytes, edits: list[tuple]) -> bytes:
    b = bytearray(data)
    for e in edits:
        kind, p = e[0], min(e[1], len(b))
        if kind == "truncate":
            del b[p:]
        elif kind == "flip":
            r = np.random.default_rng(e[3])
            for _ in range(e[2]):
                if b:
                    q = min(len(b) - 1, p + int(r.integers(0, 16)))
                    b[q] ^= 1 << int(r.integers(0, 8))
        elif kind == "overwrite":
            _, _, k, fill, s = e
            if fill == "00":
                v = b"\0" * k
            elif fill == "ff":
                v = b"\xff" * k
            elif fill == "int":  # a large little-endian integer: lengths, offsets, counts
                v = int(
                    np.random.default_rng(s).choice([0x7FFFFFFF, 0xFFFFFFFF, 0x80000000, 1 << 40])
                ).to_bytes(8, "little")[:k]
            else:
                v = np.random.default_rng(s).integers(0, 256, k, dtype=np.uint8).tobytes()
            b[p : p + k] = v
        elif kind == "insert":
            b[p:p] = np.random.default_rng(e[3]).integers(0, 256, e[2], dtype=np.uint8).tobytes()
        elif kind == "duplicate":
            _, a, k, at = e
            chunk = bytes(b[min(a, len(b)) : min(a, len(b)) + k])
            at = min(at, len(b))
            b[at:at] = chunk
    return bytes(b)


def describe(edits: list[tuple]) -> str:
    return "+".join(":".join(str(x) for x in e) for e in edits)


# --- cases -----------------------------------------------------------------------------------------


@dataclass
class Case:
    fmt: str
    index: int | str  # a number for a mutation, "hostile:NAME" for a corpus entry
    entry: dict
    target: int | None = None  # which of the entry's files is mutated
    edits: list = field(default_factory=list)
    resign: bool = False  # bundles: rewrite the manifest's sha256 after the mutation

    @property
    def key(self) -> str:
        return f"{self.fmt}#{self.index}"

    def repro(self, seed: int) -> str:
        what = (
            "unmutated"
            if self.target is None
            else f"{self.entry['files'][self.target]} {describe(self.edits)}"
        )
        what += " (manifest re-signed)" if self.resign else ""
        return f"{self.key} seed={seed} entry={self.entry['name']} {what}"


def _fmt_id(fmt: str) -> int:
    return zlib.crc32(fmt.encode())


def make_case(fmt: str, index: int, seed: int, seeds: list[dict], sizes: dict) -> Case:
    rng = np.random.default_rng([seed, _fmt_id(fmt), index])
    entry = seeds[int(rng.integers(0, len(seeds)))]
    target = int(rng.choice(entry["mutate"]))
    n = sizes[(entry["dir"], entry["files"][target])]
    edits = plan_mutations(rng, n)
    resign = bool(entry.get("resign")) and not entry["files"][target].endswith("manifest.json")
    return Case(fmt, index, entry, target, edits, resign=resign and bool(rng.random() < 0.8))


def hostile_cases(fmt: str, corpus: dict) -> list[Case]:
    return [
        Case(fmt, f"hostile:{e['name']}", e)
        for e in corpus["entries"]
        if e["format"] == fmt and e["kind"] == "hostile"
    ]


# --- running one case in a forked child ------------------------------------------------------------


@dataclass
class Result:
    case: Case
    cls: str
    code: int | None
    reason: str
    stderr: str
    seconds: float

    def record(self, seed: int) -> dict:
        return {
            "fmt": self.case.fmt,
            "index": str(self.case.index),
            "cls": self.cls,
            "code": self.code,
            "reason": self.reason,
            "repro": self.case.repro(seed),
            "seconds": round(self.seconds, 3),
        }


class Runner:
    """Prepares and forks cases; everything a child needs is loaded before the first fork."""

    def __init__(self, root: Path, corpus: dict, *, mem_limit: int = MEM_LIMIT, time_limit: float = TIME_LIMIT,
                 app=None) -> None:  # fmt: skip
        self.root = root
        self.corpus = corpus
        self.canary = bytes.fromhex(corpus["canary_hex"])
        self.mem_limit = mem_limit
        self.time_limit = time_limit
        self.blobs: dict[tuple[str, str], bytes] = {}
        for e in corpus["entries"]:
            for f in e["files"]:
                p = root / e["dir"] / f
                if p.is_file() and not p.is_symlink():
                    self.blobs[(e["dir"], f)] = p.read_bytes()
        if app is None:
            app = _import_cli()
        self.app = app
        self.cases_dir = root / "cases"

    def warm_up(self) -> dict[str, str]:
        """Run every seed entry once, unmutated, in this process: the CLI and the readers import
        what they import lazily (typer's parameter adapters alone take 0.7 s) before any fork.
        Returns {entry: outcome} for the report (every seed should import)."""
        outcomes = {}
        saved = os.dup(1), os.dup(2)
        cwd = os.getcwd()
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            for e in self.corpus["entries"]:
                if e["kind"] != "seed":
                    continue
                case = Case(e["format"], f"warm-{e['name']}", e)
                d = self.case_dir(case)
                self._prepare(case, d)
                os.chdir(d)
                os.dup2(null, 1)
                os.dup2(null, 2)
                code = 0
                argv = [a.replace("{D}", str(d)) for a in e["argv"]]
                try:
                    if e["format"] in EXEC_FORMATS:
                        code = subprocess.run([sys.executable, "-m", "mconv", *argv], timeout=600).returncode
                    else:
                        self.app(args=argv, prog_name="mconv")
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else 1
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os.dup2(saved[0], 1)
                    os.dup2(saved[1], 2)
                    os.chdir(cwd)
                outcomes[f"{e['format']}/{e['name']}"] = "valid" if code == 0 else f"exit {code}"
                self.cleanup(case)
        finally:
            os.close(null)
            for fd in saved:
                os.close(fd)
        return outcomes

    def sizes(self) -> dict:
        return {k: len(v) for k, v in self.blobs.items()}

    def case_dir(self, case: Case) -> Path:
        safe = str(case.index).replace(":", "-").replace("/", "_")
        return self.cases_dir / f"{case.fmt}-{safe}"

    # -- in the child --
    def _prepare(self, case: Case, d: Path) -> dict:
        e = case.entry
        src = self.root / e["dir"]
        if d.exists():
            shutil.rmtree(d)
        shutil.copytree(src, d, symlinks=True)
        (d / "out").mkdir(exist_ok=True)
        for rel in e.get("fifos", []):
            os.mkfifo(d / rel)
        for target, name in e.get("hardlinks", []):  # copytree copies a hard link as a new file
            (d / name).unlink(missing_ok=True)
            os.link(d / target, d / name)
        if case.target is not None:
            rel = e["files"][case.target]
            data = apply_mutations(self.blobs[(e["dir"], rel)], case.edits)
            (d / rel).write_bytes(data)
            if case.resign:
                _resign(d / "bundle")
        return {
            str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*"))
            if p.is_file() and not p.is_symlink() and "out" not in p.relative_to(d).parts
        }

    def _child(self, case: Case, d: Path) -> None:
        code = 97
        try:
            import faulthandler

            faulthandler.disable()  # a crash is a signal the parent classifies, not a dump elsewhere
            os.setpgid(0, 0)
            d.mkdir(parents=True, exist_ok=True)
            fd_out = os.open(str(d.parent / f".{d.name}.stdout"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            fd_err = os.open(str(d.parent / f".{d.name}.stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd_out, 1)
            os.dup2(fd_err, 2)
            # the Python-level streams too (under pytest they are capture objects, not fds 1/2)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            hashes = self._prepare(case, d)
            (d.parent / f".{d.name}.inputs.json").write_text(json.dumps(hashes))
            resource.setrlimit(resource.RLIMIT_AS, (self.mem_limit, self.mem_limit))
            cpu = int(self.time_limit) + 5
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
            os.chdir(d)
            argv = [a.replace("{D}", str(d)) for a in case.entry["argv"]]
            if case.fmt in EXEC_FORMATS:
                os.execv(sys.executable, [sys.executable, "-m", "mconv", *argv])
            code = 0
            try:
                self.app(args=argv, prog_name="mconv")
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - the harness's own failure, reported as exit 98
            import traceback

            traceback.print_exc()
            code = 98
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    # -- in the parent --
    def start(self, case: Case) -> tuple[int, float]:
        d = self.case_dir(case)
        pid = os.fork()
        if pid == 0:
            self._child(case, d)
        return pid, time.monotonic()

    def classify(self, case: Case, status: int | None, seconds: float) -> Result:
        d = self.case_dir(case)
        out = _read(d.parent / f".{d.name}.stdout")
        err = _read(d.parent / f".{d.name}.stderr")
        text = err.decode("utf-8", "replace")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        code = None
        if status is None:
            cls, reason = "timeout", f"no exit after {self.time_limit:.0f} s"
        elif os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig == signal.SIGKILL:
                cls, reason = "memory", "killed (SIGKILL)"
            elif sig == signal.SIGXCPU:
                cls, reason = "timeout", "CPU limit (SIGXCPU)"
            else:
                cls, reason = "other", f"signal {signal.Signals(sig).name}"
        else:
            code = os.WEXITSTATUS(status)
            if code in (97, 98):
                cls, reason = "other", "harness error in the child"
            elif any(m in text for m in MEMORY_MARKERS) and code != 0:
                cls, reason = "memory", lines[-1][:200] if lines else ""
            elif code == 3:
                cls, reason = "exit3", lines[-1][:300] if lines else ""
            elif code == 2:
                bad = len(lines) != 1 or not lines[0].startswith("error: ") or "Traceback" in text
                bad = bad or "internal error" in text
                cls = "other" if bad else "exit2"
                reason = f"multi-line message ({len(lines)} lines)" if len(lines) != 1 else lines[0][:300]
            elif code == 0:
                cls, reason = "valid", ""
            else:
                cls, reason = "other", f"exit {code}: {lines[-1][:200] if lines else ''}"
        # the canary: in anything the command printed or wrote
        if status is not None and (self.canary in out or self.canary in err or self._canary_in(d / "out")):
            cls, reason = "leak", "output holds the canary marker"
        if status is not None and cls != "leak":
            changed = self._inputs_changed(d)
            if changed:
                cls, reason = "touched", f"a file of the user's changed or removed: {changed}"
            if _created_files(d, self.root):
                cls, reason = "code", "a file named by model code or a pickle was created (PWNED)"
        return Result(case, cls, code, reason, text[-2000:], seconds)

    def _canary_in(self, out_dir: Path) -> bool:
        if not out_dir.is_dir():
            return False
        for p in out_dir.rglob("*"):
            if p.is_file() and not p.is_symlink():
                with open(p, "rb") as f:
                    tail = b""
                    while chunk := f.read(1 << 20):
                        if self.canary in tail + chunk:
                            return True
                        tail = chunk[-len(self.canary) :]
        return False

    def _inputs_changed(self, d: Path) -> str:
        try:
            before = json.loads((d.parent / f".{d.name}.inputs.json").read_text())
        except (OSError, ValueError):
            return ""
        for rel, digest in before.items():
            p = d / rel
            if not p.is_file() or hashlib.sha256(p.read_bytes()).hexdigest() != digest:
                return rel
        return ""

    def cleanup(self, case: Case) -> None:
        d = self.case_dir(case)
        shutil.rmtree(d, ignore_errors=True)
        for suffix in (".stdout", ".stderr", ".inputs.json"):
            (d.parent / f".{d.name}{suffix}").unlink(missing_ok=True)
        for p in _created_files(d, self.root):
            p.unlink(missing_ok=True)

    def run_all(self, cases: list[Case], jobs: int, progress=None, keep: bool = False) -> list[Result]:
        results: list[Result] = []
        running: dict[int, tuple[Case, float]] = {}
        todo = list(reversed(cases))
        while todo or running:
            while todo and len(running) < jobs:
                case = todo.pop()
                pid, t0 = self.start(case)
                running[pid] = (case, t0)
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                now = time.monotonic()
                for p, (case, t0) in list(running.items()):
                    if now - t0 > self.time_limit:
                        _kill_group(p)
                        os.waitpid(p, 0)
                        del running[p]
                        results.append(self.classify(case, None, now - t0))
                        if not keep:
                            self.cleanup(case)
                        if progress:
                            progress(results[-1])
                _wait_briefly()
                continue
            if pid not in running:
                continue
            case, t0 = running.pop(pid)
            _kill_group(pid)  # anything the case left behind
            results.append(self.classify(case, status, time.monotonic() - t0))
            if not keep:
                self.cleanup(case)
            if progress:
                progress(results[-1])
        return results


def _created_files(d: Path, root: Path) -> list[Path]:
    """Files the hostile corpus's pickles, model code and archive members would create."""
    found = [*d.rglob("PWNED*"), *root.glob("PWNED*"), *(root / "cases").glob("PWNED*")]
    return found + [p for p in (Path("/tmp/PWNED_abs"),) if p.exists()]


def _wait_briefly() -> None:
    select.select([], [], [], 0.002)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read(p: Path) -> bytes:
    try:
        return p.read_bytes()
    except OSError:
        return b""


def _resign(bundle: Path) -> None:
    """A mutated bundle file with its manifest's size and sha256 updated (reaches past the check)."""
    try:
        m = json.loads((bundle / "manifest.json").read_text())
    except (OSError, ValueError):
        return
    for rel, meta in m.get("files", {}).items():
        f = bundle / rel
        if isinstance(meta, dict) and f.is_file():
            meta["bytes"] = f.stat().st_size
            meta["sha256"] = hashlib.sha256(f.read_bytes()).hexdigest()
    (bundle / "manifest.json").write_text(json.dumps(m, sort_keys=True, indent=1))


def _import_cli(fmt: str | None = None):
    """Import the CLI and every reader (and what they import lazily) before the first fork.
    torch only where the torch reader runs: every mapped megabyte makes each fork slower."""
    from mconv.cli.app import app
    from mconv.formats import registry

    registry()
    import importlib

    for mod in (
        "mconv.irio",
        "mconv.metrics",
        "mconv.api.runtime",
        "mconv.bundle",
        "mconv.api.inspection",
        "mconv.container",
        "mconv.targets.weights",
        "h5py",
        "onnxruntime",
        "tflite",
        "ml_dtypes",
        "safetensors",
        *(("torch", "torch.onnx") if fmt in (None, "torch", "torchscript-code") else ()),
        "mconv.targets",
        "mconv.targets.cpu",
        "mconv.targets.reference",
    ):
        try:
            importlib.import_module(mod)
        except ImportError:
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
    return app


# --- the run ---------------------------------------------------------------------------------------


def build_corpus(root: Path, seed: int, formats: list[str]) -> dict:
    cmd = [sys.executable, str(REPO / "bench" / "fuzz_corpus.py"), str(root), "--seed", str(seed)]
    cmd += ["--formats", ",".join(formats)]
    subprocess.run(cmd, check=True)
    return json.loads((root / "corpus.json").read_text())


def plan(corpus: dict, formats: list[str], n_cases: int, seed: int, sizes: dict) -> list[Case]:
    cases: list[Case] = []
    for fmt in formats:
        seeds = [e for e in corpus["entries"] if e["format"] == fmt and e["kind"] == "seed"]
        if seeds:
            cases += [make_case(fmt, i, seed, seeds, sizes) for i in range(n_cases)]
        cases += hostile_cases(fmt, corpus)
    return cases


def _is_hostile(rec: dict) -> bool:
    return rec["index"].startswith("hostile:")


def table(records: list[dict], formats: list[str], hostile: bool) -> str:
    head = (
        "| format | cases | clean exit 2 | valid | exit 3 | timeout | memory limit | leaks | code run "
        "| files touched | other |"
    )
    rows = [head, "|" + "---|" * 11]
    tot = dict.fromkeys(CLASSES, 0)
    n_all = 0
    for fmt in formats:
        rs = [r for r in records if r["fmt"] == fmt and _is_hostile(r) == hostile]
        if not rs:
            continue
        c = {k: sum(r["cls"] == k for r in rs) for k in CLASSES}
        for k in CLASSES:
            tot[k] += c[k]
        n_all += len(rs)
        rows.append(
            f"| {fmt} | {len(rs)} | {c['exit2']} | {c['valid']} | {c['exit3']} | {c['timeout']} | "
            f"{c['memory']} | {c['leak']} | {c['code']} | {c['touched']} | {c['other']} |"
        )
    rows.append(
        f"| all | {n_all} | {tot['exit2']} | {tot['valid']} | {tot['exit3']} | {tot['timeout']} | "
        f"{tot['memory']} | {tot['leak']} | {tot['code']} | {tot['touched']} | {tot['other']} |"
    )
    return "\n".join(rows)


def failures(records: list[dict]) -> list[str]:
    return [
        f"{r['repro']}  => {r['cls']}: {r['reason']}".replace("\n", "\\n")
        for r in records
        if r["cls"] not in ("exit2", "valid")
    ]


def report(records: list[dict], formats: list[str], args, seconds: float, corpus: dict) -> str:
    lines = [
        "# mconv fuzzing (bench/fuzz.py)",
        "",
        f"Command: `python bench/fuzz.py --cases {args.cases} --seed {args.seed} --jobs {args.jobs} "
        f"--formats {','.join(formats)}`; {len(records)} cases in {seconds:.0f} s "
        f"({os.cpu_count()} CPUs), RLIMIT_AS {MEM_LIMIT >> 30} GiB, {TIME_LIMIT:.0f} s per case.",
        "",
        "## Seeded mutations (truncation, bit flips, 1-8 byte overwrites, inserts, duplicated ranges)",
        "",
        table(records, formats, hostile=False),
        "",
        "## Hand-built hostile corpus (bench/fuzz_corpus.py; each entry once)",
        "",
        table(records, formats, hostile=True),
        "",
    ]
    hostile_rows = [r for r in records if _is_hostile(r)]
    if hostile_rows:
        lines += ["| hostile entry | outcome | message |", "|---|---|---|"]
        for r in hostile_rows:
            msg = (r["reason"] or "").replace("|", "\\|")[:200]
            lines.append(f"| {r['fmt']}#{r['index']} | {r['cls']} | {msg} |")
        lines.append("")
    fails = failures(records)
    lines += [
        f"## Failing cases ({len(fails)}; replay: `python bench/fuzz.py --replay 'FORMAT#N seed=S'`)",
        "",
    ]
    lines += [f"- `{f[:400]}`" for f in fails[:200]]
    if len(fails) > 200:
        lines.append(f"- ... {len(fails) - 200} more in the log")
    bad_seeds = {k: v for k, v in corpus.get("seed_outcomes", {}).items() if v != "valid"}
    if bad_seeds:
        lines += ["", "Seeds that do not import unmutated (a finding in itself):"]
        lines += [f"- {k}: {v}" for k, v in sorted(bad_seeds.items())]
    if corpus.get("builder_failures"):
        lines += ["", "Corpus builders that failed:", *[f"- {f}" for f in corpus["builder_failures"]]]
    return "\n".join(lines) + "\n"


def parse_replay(text: str) -> tuple[str, str, int | None]:
    first, *rest = text.split()
    fmt, _, index = first.partition("#")
    seed = None
    for tok in rest:
        if tok.startswith("seed="):
            seed = int(tok[5:])
    return fmt, index, seed


def run_worker(fmt: str, root: Path, seed: int, n_cases: int, hostile: bool, results: Path) -> int:
    """One format's cases, forked one at a time from this process (imports only that format needs)."""
    import gc

    corpus = json.loads((root / "corpus.json").read_text())
    corpus["entries"] = [e for e in corpus["entries"] if e["format"] == fmt]
    runner = Runner(root, corpus, app=_import_cli(fmt))
    outcomes = runner.warm_up()
    for name, outcome in outcomes.items():
        if outcome != "valid":
            print(f"seed {name} does not import unmutated: {outcome}", file=sys.stderr)
    cases = plan(corpus, [fmt], n_cases, seed, runner.sizes())
    if not hostile:
        cases = [c for c in cases if not str(c.index).startswith("hostile:")]
    gc.collect()
    gc.freeze()  # no copy-on-write faults from the collector touching every object in each child
    _malloc_trim()
    t0 = time.monotonic()

    def progress(r: Result) -> None:
        if r.cls not in ("exit2", "valid"):
            print(f"  {r.case.repro(seed)} => {r.cls}: {r.reason[:200]}", file=sys.stderr, flush=True)

    out = runner.run_all(cases, 1, progress)
    with open(results, "w") as f:
        f.write(json.dumps({"seed_outcomes": outcomes}) + "\n")
        for r in out:
            f.write(json.dumps(r.record(seed)) + "\n")
    print(f"{fmt}: {len(out)} cases in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return 0


def _malloc_trim() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# the slowest formats first, so the last worker to finish is a fast one
_COST_ORDER = ("torch", "keras-h5", "keras-json", "onnx", "caffe", "tflite", "keras-zip", "bundle")


def run_workers(root: Path, formats: list[str], args) -> tuple[list[dict], dict]:
    order = sorted(formats, key=lambda f: (_COST_ORDER.index(f) if f in _COST_ORDER else 99, f))
    todo = list(reversed(order))
    running: dict[subprocess.Popen, Path] = {}
    records: list[dict] = []
    seed_outcomes: dict = {}
    while todo or running:
        while todo and len(running) < args.jobs:
            fmt = todo.pop()
            res = root / f"results-{fmt}.jsonl"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", fmt, "--corpus", str(root)]
            cmd += ["--seed", str(args.seed), "--cases", str(args.cases), "--results", str(res)]
            cmd += ["--no-hostile"] if args.no_hostile else []
            running[subprocess.Popen(cmd)] = res
        time.sleep(0.2)
        for proc in [p for p in running if p.poll() is not None]:
            res = running.pop(proc)
            if proc.returncode != 0 or not res.is_file():
                print(f"worker {proc.args[3]} failed (exit {proc.returncode})", file=sys.stderr)
                continue
            first, *rest = res.read_text().splitlines()
            seed_outcomes.update(json.loads(first)["seed_outcomes"])
            records += [json.loads(line) for line in rest]
    records.sort(key=lambda r: (formats.index(r["fmt"]), _is_hostile(r), _index_key(r["index"])))
    return records, seed_outcomes


def _index_key(index: str):
    return (0, int(index), "") if index.isdigit() else (1, 0, index)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Seeded mutation fuzzing of every mconv reader.")
    ap.add_argument("--cases", type=int, default=2000, help="mutation cases per format")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--jobs", type=int, default=2, help="formats fuzzed side by side")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    ap.add_argument("--log", type=Path, default=None, help="failing cases, one replayable line each")
    ap.add_argument("--replay", default=None, help="'FORMAT#N seed=S' (a line of the log)")
    ap.add_argument("--corpus", type=Path, default=None, help="reuse (or build into) this corpus folder")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (cases and corpus)")
    ap.add_argument("--no-hostile", action="store_true", help="mutations only")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--results", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        return run_worker(args.worker, args.corpus, args.seed, args.cases, not args.no_hostile, args.results)
    formats = [f for f in args.formats.split(",") if f]
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        ap.error(f"unknown formats {unknown}; choose from {','.join(FORMATS)}")
    replay = parse_replay(args.replay) if args.replay else None
    if replay:
        formats = [replay[0]]
        if replay[2] is not None:
            args.seed = replay[2]
    tmp = Path(tempfile.mkdtemp(prefix="mconv-fuzz-"))
    root = args.corpus or (tmp / "root")
    t0 = time.monotonic()
    try:
        if (root / "corpus.json").is_file():
            corpus = json.loads((root / "corpus.json").read_text())
        else:
            corpus = build_corpus(root, args.seed, formats if args.corpus is None else list(FORMATS))
        for f in corpus.get("builder_failures", []):
            print(f"corpus builder failed: {f}", file=sys.stderr)
        if replay:
            return _replay(root, corpus, replay, args)
        records, corpus["seed_outcomes"] = run_workers(root, formats, args)
        seconds = time.monotonic() - t0
        print(table(records, formats, hostile=False))
        print()
        print(table(records, formats, hostile=True))
        print(f"{len(records)} cases in {seconds:.0f} s (corpus included)")
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(report(records, formats, args, seconds, corpus))
        if args.log:
            args.log.parent.mkdir(parents=True, exist_ok=True)
            args.log.write_text("".join(f + "\n" for f in failures(records)))
        return 0
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _replay(root: Path, corpus: dict, replay, args) -> int:
    fmt, index, _ = replay
    corpus = dict(corpus, entries=[e for e in corpus["entries"] if e["format"] == fmt])
    runner = Runner(root, corpus, app=_import_cli(fmt))
    if index.startswith("hostile:"):
        cases = [c for c in hostile_cases(fmt, corpus) if c.index == index]
    else:
        seeds = [e for e in corpus["entries"] if e["kind"] == "seed"]
        cases = [make_case(fmt, int(index), args.seed, seeds, runner.sizes())]
    if not cases:
        print(f"no case {fmt}#{index}", file=sys.stderr)
        return 2
    for c in cases:
        for rel, digest in c.entry.get("sha256", {}).items():
            if hashlib.sha256(runner.blobs[(c.entry["dir"], rel)]).hexdigest() != digest:
                print(f"warning: seed {rel} differs from the logged run's", file=sys.stderr)
    (r,) = runner.run_all(cases, 1, keep=True)
    d = runner.case_dir(r.case)
    print(r.case.repro(args.seed))
    print(f"outcome: {r.cls} (exit {r.code}) {r.reason}")
    print("argv: mconv " + " ".join(a.replace("{D}", str(d)) for a in r.case.entry["argv"]))
    print("stderr:\n" + r.stderr)
    if args.keep:
        print(f"case folder kept: {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
