"""P7: ``mconv optimize`` with the AlexNet Deep Compression recipe, no fine-tuning data.

The model is light_bvlc_alexnet with trained-like weights (bench/alexnet_size.py's
``make_alexnet``: i.i.d. Student-t(3) at He std, 244 MB of float32). The CLI runs as a
subprocess; wall time is measured around it and peak RSS is the child's own VmHWM, which it
prints at exit (``ru_maxrss`` of children would include this parent's pre-exec memory). Targets:
<= 30 s, peak RSS <= 2x the model's size.

    python bench/optimize_alexnet.py [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from alexnet_size import RECIPE, make_alexnet  # noqa: E402

TARGET_SECONDS = 30.0


# Runs `mconv ...` and reports its own peak resident set (VmHWM) as the last line on stderr.
CHILD = """
import atexit, sys
def _hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM'):
            sys.stderr.write('VmHWM ' + line.split()[1] + '\\n')
atexit.register(_hwm)
sys.argv = ['mconv'] + sys.argv[1:]
from mconv.cli.app import main
main()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, help="where to write the models (default: a temp dir)")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="alexnet_opt_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        src = make_alexnet(work / "alexnet.onnx")
        size = src.stat().st_size
        out = work / "alexnet_dc.onnx"
        cmd = [
            sys.executable,
            "-c",
            CHILD,
            "optimize",
            str(src),
            "--recipe",
            str(RECIPE),
            "-o",
            str(out),
            "-q",
        ]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if r.returncode != 0:
            sys.exit(f"mconv optimize failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
        # VmHWM of the child itself: ru_maxrss of children would also count this parent's memory
        # (Linux keeps the pre-exec high-water mark of a forked child).
        peak = int(r.stderr.strip().splitlines()[-1].split()[1]) * 1024
        print(
            f"machine load average: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs"
        )
        print(f"model: {size / 1e6:.1f} MB ({src.name}), recipe {RECIPE.name}, no --data")
        print(
            f"wall time: {seconds:.1f} s (target <= {TARGET_SECONDS:.0f} s): "
            f"{'PASS' if seconds <= TARGET_SECONDS else 'FAIL'}"
        )
        print(
            f"peak RSS: {peak / 1e6:.0f} MB = {peak / size:.2f}x the model (target <= 2x): "
            f"{'PASS' if peak <= 2 * size else 'FAIL'}"
        )
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
