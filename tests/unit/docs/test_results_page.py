"""docs/results.md reads by question, and every table says when and where it was measured (issue 38, part 5).

* The page's ``##`` sections are the questions a user asks (which plan moves how many bytes, which policy at
  which bandwidth, accuracy and the guard, scaling, peers, GPU, mini-batch).
* Every table stands in a section that, itself or through the sections it sits in, names its machine and a
  date (``YYYY-MM-DD``, or says the date was "not recorded").
* No page of the README or docs, and no code comment, counts work in sessions ("the ninth session"): results
  are named by date and commit.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "docs" / "results.md"
QUESTIONS = ("Which exchange plan moves how many bytes", "Which policy, at which bandwidth, reaches accuracy how fast",
             "How accurate each policy is, and what the guard does", "How it scales", "Against peers", "On a GPU",
             "Mini-batch against full-graph training")
SESSIONS = re.compile(r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|last|this|next|previous) "
                      r"session\b", re.I)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b|not recorded")


def sections(text: str) -> list[tuple[int, str, str]]:
    """(level, heading, body) of every heading outside code blocks; the body runs to the next heading."""
    found: list[tuple[int, str, list[str]]] = []
    fenced = False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"(#{1,6}) (.*)", line)
        if match:
            found.append((len(match.group(1)), match.group(2), []))
        elif found:
            found[-1][2].append(line)
    return [(level, heading, "\n".join(body)) for level, heading, body in found]


def test_the_page_is_organised_by_question() -> None:
    headings = [heading for level, heading, _ in sections(RESULTS.read_text()) if level == 2]
    for question in QUESTIONS:
        assert any(heading.startswith(question) for heading in headings), (question, headings)


def test_every_table_says_its_machine_and_date() -> None:
    chain: list[tuple[int, str, str]] = []
    unsaid = []
    for level, heading, body in sections(RESULTS.read_text()):
        chain = [entry for entry in chain if entry[0] < level] + [(level, heading, body)]
        if not re.search(r"^\|.*\|\s*$", body, re.M):
            continue
        context = "\n".join(f"{h}\n{b}" for lvl, h, b in chain if lvl > 1)  # not the page's own intro
        if not DATE.search(context) or "machine" not in context.lower():
            unsaid.append(heading)
    assert not unsaid, f"docs/results.md: tables without a machine or a date: {unsaid}"


def test_nothing_is_counted_in_sessions() -> None:
    places = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    for package in ("sparse_dist", "algorithms", "runners"):
        places += [p for p in (ROOT / package).rglob("*") if p.suffix in (".py", ".toml", ".md")]
    found = [f"{path.relative_to(ROOT)}:{number}" for path in places
             for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1)
             if SESSIONS.search(line)]
    assert not found, f"results are named by date and commit, not by session: {found}"
    assert len(places) > 100, len(places)
