"""The ``helm`` binary the chart tests render with, and their skip marker.

``deploy/check.sh`` installs helm under ``$ABSTAIN_TOOLS_DIR`` (default
``~/.cache/abstain-tools``); ``ABSTAIN_HELM`` names another binary; else ``helm`` on PATH.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

__all__ = ["HELM", "needs_helm"]


def _helm() -> str | None:
    if os.environ.get("ABSTAIN_HELM"):
        return os.environ["ABSTAIN_HELM"]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    tools = Path(os.environ.get("ABSTAIN_TOOLS_DIR", cache / "abstain-tools"))
    installed = tools / "helm" / "helm"
    return str(installed) if installed.exists() else shutil.which("helm")


HELM = _helm()
needs_helm = pytest.mark.skipif(HELM is None, reason="no helm (run deploy/check.sh once)")
