"""Examples and facts of the user docs that a reader copies: they run as written and match the package."""

from __future__ import annotations

import pytest

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

# Minutes of spawned jobs on 2 cores: the full suite runs this file, the fast lane (-m 'not slow') skips it.
pytestmark = [pytest.mark.dist, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.S)


def test_the_driver_listing_starts_a_group_as_written(tmp_path):
    listing = next(b for b in _blocks("writing-a-driver.md") if "class EmulatedDriver(Driver)" in b)
    name = re.search(r'register_backend\("(\w+)", EmulatedDriver\)', listing).group(1)
    script = tmp_path / "my_driver.py"
    script.write_text(listing + textwrap.dedent(f"""

        def work():
            import hwdist
            t = torch.tensor([float(hwdist.get_rank() + 1)])
            hwdist.all_reduce(t)
            return hwdist.get_backend(), t.item()


        if __name__ == "__main__":
            from hwdist.testing import run_distributed

            print(run_distributed(work, 2, {name!r}, timeout=120))
    """))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip() == str([(name, 3.0), (name, 3.0)])


def test_the_test_extra_table_names_every_package_of_the_extra():
    pyproject = (ROOT / "pyproject.toml").read_text()
    extra = re.search(r"^test = \[(.*?)\]", pyproject, flags=re.S | re.M).group(1)
    packages = [re.match(r"[A-Za-z0-9_.-]+", p.strip().strip('"')).group(0) for p in extra.split('",')]
    lines = (DOCS / "getting-started.md").read_text().splitlines()
    row = next(ln for ln in lines if ln.startswith("| `test` |"))
    missing = [p for p in packages if p.lower() not in row.lower()]
    assert not missing, f"getting-started.md's `test` row omits {missing}: {row}"


def test_the_docs_name_one_destroy():
    for page in DOCS.glob("*.md"):
        text = page.read_text()
        assert "hwdist.launch.destroy()" not in text, f"{page.name}: the public name is hwdist.destroy()"


def test_the_testing_page_introduces_combo_before_using_it():
    text = (DOCS / "testing.md").read_text()
    first_use = text.index("combo)")
    assert "`combo` fixture" in text[:first_use], "testing.md uses the combo fixture before introducing it"
