"""The report page: sections in order, PNGs embedded in the HTML and written next to the
Markdown twin, and the small table and number helpers every section uses."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewardplane.core import atomic


@dataclass
class Page:
    """Sections in order as (title, markdown body, html body), plus the PNGs the Markdown links to."""

    sections: list[tuple[str, str, str]] = field(default_factory=list)
    figures: dict[str, bytes] = field(default_factory=dict)

    def add(self, title: str, markdown: str, html_body: str) -> None:
        self.sections.append((title, markdown, html_body))

    def add_figure(self, title: str, name: str, png: bytes, caption: str) -> None:
        self.figures[name] = png
        encoded = base64.b64encode(png).decode("ascii")
        self.add(
            title,
            f"![{caption}]({name})\n\n{caption}",
            f'<img alt="{html.escape(caption)}" src="data:image/png;base64,{encoded}">'
            f"<p class=caption>{html.escape(caption)}</p>",
        )


def png(fig: Any) -> bytes:
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def table(headers: list[str], rows: list[list[str]]) -> tuple[str, str]:
    markdown = "| " + " | ".join(headers) + " |\n|" + "---|" * len(headers) + "\n"
    markdown += "".join("| " + " | ".join(r) + " |\n" for r in rows)
    cells = "".join("<th>" + html.escape(h) + "</th>" for h in headers)
    body = "".join("<tr>" + "".join("<td>" + html.escape(c) + "</td>" for c in r) + "</tr>" for r in rows)
    return markdown, f"<table><tr>{cells}</tr>{body}</table>"


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def add_table(page: Page, title: str, headers: list[str], rows: list[list[str]], note: str = "") -> None:
    md, html_table = table(headers, rows)
    page.add(
        title,
        md + (f"\n{note}" if note else ""),
        html_table + (f"<p>{html.escape(note)}</p>" if note else ""),
    )


def render_html(title: str, page: Page) -> str:
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
        "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f3f3}td:first-child{text-align:left}"
        "img{max-width:100%}pre{background:#f6f6f6;padding:0.8em;overflow-x:auto}.caption{color:#555}"
    )
    body = "".join(f"<h2>{html.escape(t)}</h2>\n{h}\n" for t, _, h in page.sections)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>\n{body}</body></html>\n"
    )


def write_page(out: Path, title: str, page: Page) -> Path:
    for name, png in page.figures.items():
        atomic.write_bytes(out / name, png)
    markdown = f"# {title}\n\n" + "".join(f"## {t}\n\n{m}\n\n" for t, m, _ in page.sections)
    atomic.write_text(out / "report.md", markdown)
    atomic.write_text(out / "report.html", render_html(title, page))
    return out / "report.html"
