"""What the machine has that pip does not install, and when its absence may skip a test.

``scripts/test`` installs the system packages some tests use (lavapipe, Chromium, Node.js,
espeak-ng) wherever it can: as root with ``apt-get``. There a missing one is a failure, not a
skip; elsewhere the tests that need it skip, naming the package. Import with ``tests/`` on
``sys.path`` (``from _system import needs_webgpu_adapter``)."""

from __future__ import annotations

import functools
import os
import shutil

import pytest


def can_install_system_packages() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


@functools.cache
def webgpu_adapter() -> bool:
    """A wgpu adapter opens (lavapipe, Mesa's Vulkan on the CPU, here)."""
    from mconv.errors import InputError

    try:
        from mconv.targets.webgpu import runner

        runner.request_device("probe", False, 4)
        return True
    except InputError:
        return False


needs_webgpu_adapter = pytest.mark.skipif(
    not can_install_system_packages() and not webgpu_adapter(),
    reason="no WebGPU adapter (apt-get install mesa-vulkan-drivers)",
)
