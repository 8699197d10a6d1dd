"""The last check before publishing: the tag, the version and one wheel per variant.

    python ci/check_release.py v0.1.0 dist/*.whl

Passes when the tag is `v` + samattn/_version.py's version and the wheels are exactly one
samattn_<variant>-<version>-<python_tag>-none-<platform>.whl for every variant of
ci/variants.toml (each already passed ci/check_wheel.py --release and the GPU gate).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import variants

ROOT = Path(__file__).resolve().parents[1]


def problems(tag: str, wheels: list[Path]) -> list[str]:
    version = re.search(r'__version__ = "([^"]+)"', (ROOT / "samattn/_version.py").read_text())[1]
    found = []
    if tag != f"v{version}":
        found.append(f"tag {tag} does not name version {version} (samattn/_version.py)")
    table = variants.load()
    expected = {
        f"samattn_{name}-{version}-{v['python_tag']}-none-{v['platform']}.whl"
        for name, v in table.items()
    }
    names = sorted(w.name for w in wheels)
    for missing in sorted(expected - set(names)):
        found.append(f"missing {missing}")
    for extra in sorted(set(names) - expected):
        found.append(f"unexpected {extra}")
    return found


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    found = problems(argv[0], [Path(a) for a in argv[1:]])
    print("\n".join(found) or f"{argv[0]}: {len(argv) - 1} wheels, one per variant: ready")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
