"""The docs hold no scripts, and every repository path they cite exists."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# docs/results/<date>/ holds what the analysis wrote that day (its notes name the code of then): not checked
PAGES = [REPO / "README.md", REPO / "kernels" / "README.md",
         *sorted(p for p in (REPO / "docs").rglob("*.md") if (REPO / "docs" / "results") not in p.parents)]
# a repository path in backticks (from the repository root): `docs/...`, `kernels/...`, ...; `{a,b}` expanded
CITED = re.compile(r"`((?:docs|kernels|benchmarks|sweeps|tests|trainable|calibration|common)/[A-Za-z0-9_.{},/-]+)`")
# a relative Markdown link (from the page's folder), its #anchor dropped
LINKED = re.compile(r"\]\((?!https?:|#|mailto:)([^)#\s]+)(?:#[^)]*)?\)")


def _expand(path: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [p for option in match.group(1).split(",") for p in _expand(path[:match.start()] + option +
                                                                       path[match.end():])]


def test_no_scripts_or_patches_under_docs():
    scripts = [str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*")
               if p.suffix in (".py", ".sh", ".patch", ".ipynb")]
    assert scripts == [], f"docs/ holds results, not code; move these to benchmarks/ or delete them: {scripts}"


def test_every_cited_path_exists():
    missing = []
    for page in PAGES:
        text = page.read_text()
        paths = [REPO / path for cited in CITED.findall(text) for path in _expand(cited.rstrip("/.,"))]
        paths += [page.parent / link for link in LINKED.findall(text)]
        missing += [f"{page.relative_to(REPO)}: {path.relative_to(REPO) if path.is_relative_to(REPO) else path}"
                    for path in paths if "<" not in str(path) and "*" not in str(path) and not path.exists()]
    assert missing == [], "cited paths that do not exist:\n" + "\n".join(missing)
