"""Runtime tests share helpers as ``tests.runtime.*`` modules (the fake NVML binding is imported by name, also in
the child processes of ``kdvfs capture``, which get the repository root on PYTHONPATH): make the root importable
here too, however pytest was started."""

from __future__ import annotations

import sys

from kdvfs.envs.common.paths import REPO_ROOT

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
