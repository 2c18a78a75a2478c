"""The documentation runs: every ```python block of README.md and docs/ is executed.

The blocks of one page run in order, in one namespace, in a process of their own (a page
may change process-wide state, such as JAX's x64 flag) whose working directory is a fresh
temporary folder. A block titled with a file name (```toml title="run.toml") is written
there when the page reaches it, so a page can show a file and then read it. A python block
is skipped only when it needs hardware that a CPU machine lacks: its fence carries one of
the titles in `NEEDS` (```python title="needs a GPU"), or an HTML comment right before it
says the same (<!-- needs a GPU -->).

The benchmarks page and the README's results table are rendered from committed JSON; the
last test fails when they differ from what `benchmarks/render.py` makes of it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Hardware absent on the machines that run the suite; the only reasons a block may be skipped.
NEEDS = ("needs a GPU", "needs Gaudi", "needs torchrun")
# A skipped block runs nowhere: keep them few.
MAX_SKIPPED = 4
# A page's blocks run in one process; a page that loads a real model stays well under this.
TIMEOUT_S = 600

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,})(?P<info>[^`]*)$")
_TITLE = re.compile(r'title="(?P<title>[^"]*)"')
_COMMENT = re.compile(r"^\s*<!--\s*(?P<text>.*?)\s*-->\s*$")
_FILE_NAME = re.compile(r"^[\w.-]+\.\w+$")

# Executes the blocks it reads as JSON on stdin, in order, in one namespace. Each block is
# compiled under its page's name with its first line where the page has it, so a traceback
# names the page and the line.
_DRIVER = """
import json, pathlib, sys
namespace = {"__name__": "__main__"}
for block in json.load(sys.stdin):
    if block["kind"] == "file":
        pathlib.Path(block["name"]).write_text(block["code"])
        continue
    code = "\\n" * (block["line"] - 1) + block["code"]
    exec(compile(code, block["page"], "exec"), namespace)
"""


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block: its language, fence title, first code line (1-based) and text."""

    page: str
    language: str
    title: str | None
    line: int
    code: str
    skip: str | None  # the hardware it needs, or None: it runs


def blocks(text: str, page: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, nested ones (in lists, admonitions) included."""
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, ticks = opening["indent"], opening["ticks"]
        info = opening["info"].strip()
        language = info.split(" ", 1)[0].split("{", 1)[0].strip().lower()
        title = _TITLE.search(info)
        comment = _COMMENT.match(lines[i - 1]) if i > 0 else None
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not re.match(rf"^{re.escape(indent)}{ticks}\s*$", lines[j].rstrip()):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        if j == len(lines):
            raise ValueError(f"{page}:{i + 1}: a code fence that is never closed")
        reason = next((r for r in NEEDS if (title and title["title"] == r)
                       or (comment and comment["text"] == r)), None)
        found.append(Block(page=page, language=language, title=title["title"] if title else None,
                           line=i + 2, code="\n".join(body) + "\n", skip=reason))
        i = j + 1
    return found


def runnable(page_blocks: list[Block]) -> list[dict[str, object]]:
    """What the driver runs: python blocks that need no absent hardware, and titled files."""
    out: list[dict[str, object]] = []
    for b in page_blocks:
        if b.language == "python" and b.skip is None:
            out.append({"kind": "python", "page": b.page, "line": b.line, "code": b.code})
        elif b.language != "python" and b.title and _FILE_NAME.match(b.title):
            out.append({"kind": "file", "name": b.title, "code": b.code})
    return out


def run_blocks(page_blocks: list[Block], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a page's blocks in a fresh interpreter whose working directory is `cwd`."""
    return subprocess.run([sys.executable, "-c", _DRIVER], input=json.dumps(runnable(page_blocks)),
                          capture_output=True, text=True, cwd=cwd, timeout=TIMEOUT_S)


def pages() -> list[Path]:
    """README.md and every Markdown page of the docs site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _page_blocks(path: Path) -> list[Block]:
    return blocks(path.read_text(), str(path.relative_to(ROOT)))


PAGES_WITH_CODE = [p for p in pages() if any(b.language == "python" for b in _page_blocks(p))]


@pytest.mark.parametrize("path", PAGES_WITH_CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_python_blocks_of_a_page_run(path: Path, tmp_path: Path) -> None:
    page_blocks = _page_blocks(path)
    result = run_blocks(page_blocks, tmp_path)
    assert result.returncode == 0, f"{path.relative_to(ROOT)}:\n{result.stderr[-6000:]}"


def test_the_pages_that_must_teach_by_example_have_code() -> None:
    # A newcomer with only the site swaps a backend, embeds `verify` and tests a sampler.
    must = ["README.md", "docs/guide/use.md", "docs/guide/embed.md", "docs/guide/testing.md",
            "docs/guide/backends.md", "docs/guide/configuration.md"]
    have = {str(p.relative_to(ROOT)) for p in PAGES_WITH_CODE}
    assert sorted(set(must) - have) == []
    embed = "".join(b.code for b in _page_blocks(ROOT / "docs/guide/embed.md") if b.language == "python")
    assert "verify(" in embed and "uniforms(" in embed
    testing = "".join(b.code for b in _page_blocks(ROOT / "docs/guide/testing.md") if b.language == "python")
    assert "goodness_of_fit(" in testing and "broken." in testing


def test_only_blocks_that_need_absent_hardware_are_skipped() -> None:
    every = [b for p in pages() for b in _page_blocks(p)]
    # A python block whose title or comment looks like a skip but names no known hardware runs
    # (and so fails loudly if it cannot), rather than being skipped quietly.
    skipped = [f"{b.page}:{b.line}" for b in every if b.skip is not None]
    assert all(b.language == "python" for b in every if b.skip is not None)
    assert len(skipped) <= MAX_SKIPPED, skipped


def test_a_broken_block_fails_and_names_its_page_and_line(tmp_path: Path) -> None:
    page = "\n".join([
        "# A page", "", "```python", "x = 1", "```", "", "Text.", "",
        "```python", "assert x == 2, 'the second block sees the first one's x'", "```", ""])
    page_blocks = blocks(page, "docs/broken.md")
    assert [b.line for b in page_blocks] == [4, 10]
    result = run_blocks(page_blocks, tmp_path)
    assert result.returncode != 0
    assert 'File "docs/broken.md", line 10' in result.stderr, result.stderr


def test_a_skip_marker_that_names_no_hardware_does_not_skip(tmp_path: Path) -> None:
    page = "\n".join([
        '```python title="slow"', "raise SystemExit(3)", "```", "",
        "<!-- needs a GPU -->", "```python", "raise SystemExit(4)", "```", "",
        '```python title="needs torchrun"', "raise SystemExit(5)", "```", ""])
    page_blocks = blocks(page, "docs/marked.md")
    assert [b.skip for b in page_blocks] == [None, "needs a GPU", "needs torchrun"]
    assert run_blocks(page_blocks, tmp_path).returncode == 3


def test_titled_files_are_written_before_the_blocks_after_them(tmp_path: Path) -> None:
    page = "\n".join([
        '```toml title="run.toml"', 'backend = "reference"', "```", "",
        "```python", "import pathlib", "assert 'reference' in pathlib.Path('run.toml').read_text()",
        "```", "",
        '   ```bash title="not a file name"', "   exit 1", "   ```", ""])
    page_blocks = blocks(page, "docs/files.md")
    assert [b.language for b in page_blocks] == ["toml", "python", "bash"]
    assert [r["kind"] for r in runnable(page_blocks)] == ["file", "python"]
    result = run_blocks(page_blocks, tmp_path)
    assert result.returncode == 0, result.stderr


def test_the_rendered_results_are_up_to_date() -> None:
    # `python benchmarks/render.py` writes docs/benchmarks.md and the README's table from
    # benchmarks/results/*.json; --check fails when the committed pages differ.
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "render.py"), "--check"],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _render(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(ROOT / "benchmarks" / "render.py"), "--root", str(root), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_the_check_fails_on_a_stale_page_and_missing_results_are_said(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copy(ROOT / "docs" / "benchmarks.md", tmp_path / "docs" / "benchmarks.md")
    # No results there: the pages say so for every benchmark, and the check then passes.
    assert _render(tmp_path).returncode == 0
    assert _render(tmp_path, "--check").returncode == 0
    assert (tmp_path / "docs" / "benchmarks.md").read_text().count("No results yet") == 3
    readme = tmp_path / "README.md"
    assert "No results yet" in readme.read_text()
    end = "<!-- results:end -->"
    readme.write_text(readme.read_text().replace(end, f"| a stale row |\n{end}"))
    stale = _render(tmp_path, "--check")
    assert stale.returncode == 1 and "README.md differs" in stale.stderr, stale.stderr
    readme.write_text(readme.read_text().replace("<!-- results:start -->", ""))
    assert _render(tmp_path, "--check").returncode == 2


def test_check_results_render_as_verdicts_and_are_not_listed_as_unrendered(tmp_path: Path) -> None:
    """A `specsample check` results file (check_*.json) renders its command and one row per
    test with its verdict, a `bench greedy` one (greedy_*.json) its counts; neither is among
    the "other results"."""
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    test = {"passed": False, "pvalue": 1e-9, "tv": 0.21, "tau": 0.025, "tv_bound": 1e-3,
            "detectable_tv": 0.05, "n": 9957, "m": 8, "alpha": 1e-3, "unexpected": 0}
    (results / "check_toy.json").write_text(json.dumps({
        "draft": "grown-tree:4x2", "against": "exact", "n": 9957, "rule": "tree-without-residual",
        "broken": "tree-without-residual", "settings": {"t1.0": {"tests": {"first token": test}}}}))
    (results / "greedy_toy.json").write_text(json.dumps({
        "draft": "head", "max_new_tokens": 48, "equal": 21, "near_ties": 1, "other": 0,
        "records": [{}] * 22}))
    assert _render(tmp_path).returncode == 0
    page = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "| `head` | 48 | 21/22 | 1 | 0 |" in page
    assert "specsample check --draft grown-tree:4x2 --against exact --n 9957 --broken tree-without-residual" \
        in page
    row = ("| `grown-tree:4x2` | tree-without-residual | t1.0 | first token | 9,957 | 0.2100 | 0.050 "
           "| 1e-09 | FAIL |")
    assert row in page
    assert "Other results" not in page


def test_a_tried_card_with_a_shipped_heads_plan_renders_as_its_reproduction(tmp_path: Path) -> None:
    """A card in the tried folder with a shipped card's plan and target is a second run of
    the shipped head's command: it renders beside it with the relative difference, not as a
    head of its own; a card with another plan stays a tried head."""
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shipped, tried = tmp_path / "backends" / "torch" / "heads", tmp_path / "benchmarks" / "results" / "heads"
    shipped.mkdir(parents=True)
    tried.mkdir(parents=True)

    def card(plan: dict[str, object], tokens: float, sha: str) -> str:
        table = {"tokens_per_round": {"all": tokens, "open": tokens, "grounded": tokens},
                 "alpha": {"all": 0.3}, "depth": {"all": [0.3]}}
        return json.dumps({"plan": plan, "target_fingerprint": "f", "weights_sha256": sha, "seconds": 3082,
                           "invocations": 2, "held_out_by_temperature": {"0": table, "0.7": table}})

    plan = {"epochs": 2, "samples": 2}
    (shipped / "h.json").write_text(card(plan, 1.6, "a"))
    (tried / "h-again.json").write_text(card(plan, 1.52, "b"))
    (tried / "h-other.json").write_text(card({**plan, "epochs": 4}, 1.7, "c"))
    (tried / "h-wide.json").write_text(card({**plan, "topics": 422, "label_temperature": 0.5}, 1.5, "d"))
    (tried / "h-deep.json").write_text(card({**plan, "layers": 2}, 1.5, "e"))
    assert _render(tmp_path).returncode == 0
    page = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert ("| `h-again` | `h` | T=0: 1.600 / T=0.7: 1.600 | T=0: 1.520 / T=0.7: 1.520 | 5.0% | no "
            "| 3,082 (2) |"
            in page), page
    assert "`h-other` (not shipped)" in page
    # A plan's settings past the recipes' defaults are named in its row.
    assert ("| `h-wide` (not shipped) | custom: unroll 1, feature weight None, ? tokens, 422 topics, "
            "labels at T=0.5, 2 epochs |") in page, page
    assert ("| `h-deep` (not shipped) | custom: unroll 1, feature weight None, ? tokens, 2 layers, "
            "2 epochs |") in page, page
    assert "`h-again` (not shipped)" not in page
