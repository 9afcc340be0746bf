"""The capability matrix: which optional shared recipe keys and eval metrics each backend implements, and why
an engine that does not cannot (``tpuft recipes backends``, docs/backends.md). Read from the backends' own
``CAPABILITIES`` (their schema modules), so the matrix, the recipe validation and the docs never disagree."""

from __future__ import annotations

from dataclasses import dataclass

from tpuft.backends.registry import capabilities


@dataclass(frozen=True)
class Cell:
    supported: bool
    why_not: str = ""
    """The engine's reason, for a key it refuses."""


@dataclass(frozen=True)
class Matrix:
    backends: tuple[str, ...]
    rows: tuple[tuple[str, dict[str, Cell]], ...]
    """(``train.precision`` or ``eval.metric: bleu``, backend -> cell), keys first, then metrics."""

    def counts(self) -> dict[str, int]:
        """Per backend: how many of the rows it supports."""
        return {kind: sum(cells[kind].supported for _, cells in self.rows) for kind in self.backends}

    def as_json(self) -> dict[str, object]:
        return {
            "backends": list(self.backends),
            "supported": self.counts(),
            "rows": [
                {
                    "key": name,
                    **{
                        kind: {
                            "supported": cell.supported,
                            **({"why_not": cell.why_not} if cell.why_not else {}),
                        }
                        for kind, cell in cells.items()
                    },
                }
                for name, cells in self.rows
            ],
        }


def capability_matrix() -> Matrix:
    every = capabilities()
    kinds = tuple(sorted(every))
    keys = sorted({".".join(map(str, key)) for c in every.values() for key in c.keys})
    metrics = sorted(set().union(*(c.metrics for c in every.values())))
    rows: list[tuple[str, dict[str, Cell]]] = []
    for dotted in keys:
        path = tuple(dotted.split("."))
        rows.append(
            (
                dotted,
                {
                    kind: Cell(
                        path in every[kind].keys,
                        "" if path in every[kind].keys else every[kind].reason(dotted) or "",
                    )
                    for kind in kinds
                },
            )
        )
    for metric in metrics:
        rows.append(
            (
                f"eval.metric: {metric}",
                {
                    kind: Cell(
                        metric in every[kind].metrics,
                        "" if metric in every[kind].metrics else every[kind].reason(metric) or "",
                    )
                    for kind in kinds
                },
            )
        )
    return Matrix(kinds, tuple(rows))


def marked(matrix: Matrix) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """Each row's cells as ``yes`` / ``no (n)`` and the numbered reasons ``n`` refers to: one shape for the
    terminal table and the docs' table, which would not fit a reason in a cell."""
    rows: list[tuple[str, list[str]]] = []
    notes: list[str] = []
    for name, cells in matrix.rows:
        marks = []
        for kind in matrix.backends:
            cell = cells[kind]
            if cell.supported:
                marks.append("yes")
            else:
                notes.append(f"`{name}` on {kind}: {cell.why_not or 'not implemented'}")
                marks.append(f"no ({len(notes)})")
        rows.append((name, marks))
    return rows, notes


def markdown(matrix: Matrix) -> str:
    """The table docs/backends.md embeds (between its capability-matrix markers), with the reasons as
    notes."""
    rows, notes = marked(matrix)
    lines = ["| key | " + " | ".join(matrix.backends) + " |", "|---|" + "---|" * len(matrix.backends)]
    lines += [f"| `{name}` | " + " | ".join(marks) + " |" for name, marks in rows]
    counts = matrix.counts()
    lines.append(
        "| **supported** | "
        + " | ".join(f"{counts[k]} of {len(matrix.rows)}" for k in matrix.backends)
        + " |"
    )
    numbered = [f"{i}. {note}" for i, note in enumerate(notes, 1)]
    return "\n".join(lines) + ("\n\nWhy not:\n\n" + "\n".join(numbered) if numbered else "") + "\n"
