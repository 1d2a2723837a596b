"""kvref is the standard-library oracle: importing it must not pull in torch."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_import_kvref_does_not_import_torch():
    code = "import kvref, sys; assert 'torch' not in sys.modules, 'kvref imported torch'"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
