"""``edgehub run`` refuses a manifest before serving with every problem, one a line, route errors included."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from edgehub.runtime.cli import main


def test_run_lists_every_problem_of_a_refused_manifest_one_a_line(tmp_path: Path) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(
        json.dumps(
            {
                "schemaVersion": "1.1",
                "routes": {"a": "FROM /* INTO $nowhere"},
                "storeAndForwardConfiguration": {"maxQueueByts": 1},
            }
        )
    )
    result = CliRunner().invoke(main, ["run", "--manifest", str(manifest), "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[0] == f"{manifest}: refused"
    assert "  storeAndForwardConfiguration.maxQueueByts: unknown key" in lines
    assert any(line.startswith("  routes.a: unknown sink '$nowhere'") for line in lines)
    assert not (tmp_path / "d").exists()
