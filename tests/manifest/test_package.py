"""``edgehub.manifest`` loads its names when first used: reading a manifest (``documents``) and the ACL grants
(``grants``) need no pydantic, so a serving hub that imports only those holds none; every public name resolves."""

from __future__ import annotations

import subprocess
import sys

import edgehub.manifest

PROBE = """
import sys
import edgehub.manifest
from edgehub.manifest import MAX_MANIFEST_BYTES, ManifestError, read_manifest_file
from edgehub.manifest.grants import Grant
print(sorted(m for m in ("pydantic", "pydantic_core", "lark", "edgehub.manifest.models") if m in sys.modules))
"""


def test_every_public_name_resolves_and_all_lists_them() -> None:
    assert sorted(edgehub.manifest.__all__) == sorted(edgehub.manifest._HOMES)
    for name in edgehub.manifest.__all__:
        assert getattr(edgehub.manifest, name) is not None


def test_reading_manifests_and_grants_loads_neither_pydantic_nor_lark() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
