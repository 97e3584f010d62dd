"""Every link in README.md, docs/*.md and benchmarks/**/*.md resolves: a relative link or image names a file or
folder of the repository, and a `#anchor` into a markdown file names one of its headings (GitHub's rule for a
heading's anchor: lower case, punctuation dropped, spaces to hyphens, `-1`, `-2` ... for repeats). External
http(s) links are checked for shape only (the suite never touches the network). Links inside code blocks and
inline code are not links. The checker is also run on a small synthetic tree with dead links, which must fail."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^https?://[A-Za-z0-9.-]+\.[A-Za-z]{2,}(:\d+)?(/\S*)?$")


def pages(root: Path = ROOT) -> list[Path]:
    return sorted([root / "README.md", *(root / "docs").glob("*.md"), *(root / "benchmarks").rglob("*.md")])


def prose(text: str) -> str:
    """The page without its fenced code blocks and inline code: what is left is where links live."""
    kept, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            kept.append("")
            continue
        kept.append("" if fenced else line)
    return INLINE_CODE.sub("", "\n".join(kept))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: the rendered text (code ticks, emphasis and link targets gone)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = text.replace("`", "").replace("*", "")
    text = "".join(c for c in text.lower()
                   if c in " -_" or c.isalnum() or unicodedata.category(c).startswith("M"))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def dead_links(files: list[Path], root: Path = ROOT) -> list[str]:
    """'page: target (why)' for every link that does not resolve."""
    dead = []
    for page in files:
        for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
            where = f"{page.relative_to(root).as_posix()}: {target}"
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                if target.startswith(("http://", "https://")):
                    if not EXTERNAL.match(target):
                        dead.append(f"{where} (not a well-formed http(s) address)")
                elif not target.startswith("mailto:"):
                    dead.append(f"{where} (a scheme the docs do not use)")
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                dead.append(f"{where} (no such file)")
                continue
            if root.resolve() not in (file, *file.parents):
                dead.append(f"{where} (outside the repository)")
                continue
            if anchor and file.suffix == ".md" and anchor not in anchors(file):
                dead.append(f"{where} (no heading with that anchor in {file.name})")
    return dead


def test_readme_and_docs_have_no_dead_links():
    files = pages()
    assert ROOT / "README.md" in files and len(files) > 10
    dead = dead_links(files)
    assert not dead, "dead links:\n" + "\n".join(dead)


def test_the_readme_picture_is_committed_and_small():
    images = [t for t in LINK.findall(prose((ROOT / "README.md").read_text(encoding="utf-8")))
              if t.endswith(".png")]
    assert images, "the README shows no picture"
    for image in images:
        assert (ROOT / image).stat().st_size < 200_000, f"{image} is over 200 KB"


def test_anchor_rule_matches_github():
    assert slug("The runtime, not the hardware (issue 38)") == "the-runtime-not-the-hardware-issue-38"
    assert slug("A real pretrained target: `builtin:smollm2-135m-instruct`") == \
        "a-real-pretrained-target-builtinsmollm2-135m-instruct"
    assert slug("Measured on the AMD EPYC with avx512_bf16 (2026-12-04)") == \
        "measured-on-the-amd-epyc-with-avx512_bf16-2026-12-04"
    assert slug("The quickstart's figures") == "the-quickstarts-figures"
    assert slug("**Bold** and [a link](x.md), γ=16") == "bold-and-a-link-γ16"


def test_checker_fails_on_dead_links(tmp_path):
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "B.md").write_text("# B\n\n## A section\n\n## A section\n", encoding="utf-8")
    (root / "pic.png").write_bytes(b"\x89PNG")
    (tmp_path / "outside.md").write_text("x", encoding="utf-8")  # exists, but outside the repository
    (root / "README.md").write_text(
        "# Demo\n\n"
        "[good](docs/B.md#a-section) [repeat](docs/B.md#a-section-1) ![pic](pic.png) [self](#demo)\n"
        "[web](https://example.com/x) `[in code](nowhere.md)`\n\n"
        "```\n[in a fence](nowhere.md)\n```\n\n"
        "[missing file](docs/C.md) [missing anchor](docs/B.md#no-such) ![missing pic](img/none.png)\n"
        "[bad web](https://localhost) [bad self](#nothing) [escape](../outside.md)\n",
        encoding="utf-8")
    dead = dead_links([root / "README.md"], root=root)
    assert [d.split(": ", 1)[1].split(" (")[0] for d in dead] == [
        "docs/C.md", "docs/B.md#no-such", "img/none.png", "https://localhost", "#nothing", "../outside.md"], dead
    (root / "README.md").write_text("[ok](docs/B.md) [ok too](docs/B.md#b)\n", encoding="utf-8")
    assert dead_links([root / "README.md"], root=root) == []
