"""Tables as text and Markdown, and the ratio cell every table shares.

Used by the runs' report (benchmarks.workloads.report) and the count tools
(benchmarks.counts): one way to draw a table, one way to write a ratio.
"""

from __future__ import annotations

import math

#: What follows a ratio in every table: "0.27", then this sign.
TIMES = "\N{MULTIPLICATION SIGN}"


def ratio(value: float | None, base: float | None) -> str:
    """*value* / *base* as a table cell (two decimals and TIMES), or a dash
    without both."""
    if not value or not base or not math.isfinite(value) or not math.isfinite(base):
        return "—"
    return f"{value / base:.2f}{TIMES}"


def text_table(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in [header, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def top_keys(result: dict[str, dict[str, tuple[str, float]]], top: int,
             skip: str | None = None) -> list[str]:
    """The *top* keys of a count's per-loop {key: (group, value)} rows, by
    their largest value on any loop; keys of group *skip* left out."""
    peak: dict[str, float] = {}
    for rows in result.values():
        for key, (where, value) in rows.items():
            if where != skip:
                peak[key] = max(peak.get(key, 0.0), value)
    return sorted(peak, key=lambda key: -peak[key])[:top]


def markdown(title: str, intro: str,
             parts: list[tuple[str, list[str], list[list[str]]]]) -> str:
    """A count's Markdown document: the title, the intro line, then each
    (caption, header, body) table."""
    out = [f"# {title}", intro]
    for caption, header, body in parts:
        out += [caption] if caption else []
        out.append(markdown_table(header, body))
    return "\n\n".join(out) + "\n"
