"""A hub start loads only what serving needs: cryptography (~14 MB of RSS) only when it makes its certificates
(the first start), fsspec (~15 MB) only for an upload transport, and never the test doubles of edgehub.testing
(~0.9 MB; ``edgehub link-sim`` loads its simulator when it runs), nor python-qpid-proton until the hub serves
AMQP (``--no-amqp`` runs without it: it has no aarch64 wheel). Checked in a fresh interpreter, since this one has
loaded them all for other tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from edgehub.runtime.certs import ensure_certs

PROBE = """
import sys
from pathlib import Path
import edgehub.runtime.cli
from edgehub.runtime.certs import ensure_certs, server_ssl_context
server_ssl_context(ensure_certs(Path(sys.argv[1])))
print(sorted(m for m in ("cryptography", "fsspec", "edgehub.testing", "proton") if m in sys.modules))
"""


def loaded_by_a_start(certs: Path) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE, str(certs)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_start_with_certificates_in_place_loads_neither_cryptography_nor_fsspec_nor_the_test_doubles(
    tmp_path: Path,
) -> None:
    assert ensure_certs(tmp_path / "certs").created
    assert loaded_by_a_start(tmp_path / "certs") == "[]"


def test_the_first_start_loads_cryptography_to_make_its_certificates(tmp_path: Path) -> None:
    assert loaded_by_a_start(tmp_path / "certs") == "['cryptography']"
    assert (tmp_path / "certs" / "ca.pem").is_file()
