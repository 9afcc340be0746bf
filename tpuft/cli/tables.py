"""Every table tpuft prints, fitted to the terminal's width (80 columns and up) without cutting what a user
copies.

Why not a plain ``rich.table.Table``: when its columns do not fit, Rich shrinks every one of them and cuts
each cell with an ellipsis (``qui… tor… fin…``), the run id included, which is what ``monitor``, ``resume``,
``pull``, ``convert`` and ``predict`` take. Here the widths are chosen before Rich draws:

* a *copy* column (run ids, names, paths, addresses) is shown whole, on one line, and its cells are plain
  text, never markup (a path's brackets stay); only when it cannot fit even alone is it folded across lines,
  never cut, so the whole text is still there;
* the other columns wrap at word boundaries, the widest first, down to their longest word;
* when that is not enough, the columns marked ``drop`` leave the table, ``drop=1`` first, and one line under
  the table names them (a wider terminal or ``--json`` shows them);
* when even that is not enough (a path longer than the terminal), the copy columns fold, then the others.

Every cell folds rather than ends in an ellipsis. Rich is imported only when a table is drawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.table import Table
    from rich.text import Text

_FOLD_FLOOR = 8
"""The narrowest a folded copy column gets: a path in pieces of fewer characters would not be read."""


@dataclass(frozen=True)
class Col:
    """One column: its header, whether a user copies its cells (``copy``), and when it gives way to a narrow
    terminal (``drop``: None never, 1 first, then 2, ...)."""

    header: str
    copy: bool = False
    drop: int | None = None
    justify: Literal["left", "right"] = "left"


def _extra_width(columns: int) -> int:
    """What Rich's default box adds around the cells: a space each side of every cell, a border between two
    columns and one at each edge."""
    return 3 * columns + 1


def _longest_line(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(line) for line in text.split("\n")), default=0)


def _longest_word(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(word) for word in text.split()), default=0)


class FitTable:
    """A table whose rows are added as with Rich's; a Rich renderable, drawn at the width it is given."""

    def __init__(
        self, *columns: Col, title: str | None = None, show_header: bool = True, more: str | None = "--json"
    ) -> None:
        """``more``: the verb's option that shows every column whatever the width (None: there is none)."""
        self.columns = list(columns)
        self.title = title
        self.show_header = show_header
        self.more = more
        self.rows: list[list[Text] | None] = []
        """The rows' cells; None is a section line (:meth:`add_section`)."""

    def add_row(self, *cells: str | Text) -> None:
        """A ``str`` cell is Rich markup, as in a Rich table, except in a copy column, where it is the text
        itself; a ``Text`` is taken as it is."""
        from rich.text import Text

        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        row = []
        for column, cell in zip(self.columns, cells):
            if isinstance(cell, str):
                cell = Text(cell) if column.copy else Text.from_markup(cell)
            row.append(cell)
        self.rows.append(row)

    def add_section(self) -> None:
        self.rows.append(None)

    def _widths(self, index: int) -> tuple[int, int]:
        """(the narrowest, the widest) the column's cells can be drawn without cutting or folding a word, and
        a copy cell without wrapping it."""
        cells = [row[index].plain for row in self.rows if row is not None]
        header = self.columns[index].header if self.show_header else ""
        whole = _longest_line if self.columns[index].copy else _longest_word
        narrowest = max([_longest_word(header), *map(whole, cells)])
        return max(narrowest, 1), max([_longest_line(header), *map(_longest_line, cells), 1])

    def layout(self, width: int) -> tuple[list[int], list[int]]:
        """The columns shown (their indices) and each one's width in cells, for a terminal ``width`` wide."""
        shown = list(range(len(self.columns)))
        ranges = [self._widths(i) for i in shown]

        def narrowest() -> int:
            return sum(ranges[i][0] for i in shown) + _extra_width(len(shown))

        droppable = sorted(
            (c.drop, i) for i, c in enumerate(self.columns) if c.drop is not None
        )  # the first to go first
        left_out = []
        for _, index in droppable:
            if narrowest() <= width:
                break
            shown.remove(index)
            left_out.append(index)
        for index in reversed(left_out[:-1]):  # a narrow one that went before the last one may fit again
            shown.append(index)
            if narrowest() > width:
                shown.remove(index)
        shown.sort()
        widths = {i: ranges[i][1] for i in shown}
        excess = sum(widths.values()) + _extra_width(len(shown)) - width
        # the wrapping columns give way first (down to their longest word), then the copy ones fold, then
        # the others' words do
        stages = (
            {i: ranges[i][0] for i in shown if not self.columns[i].copy},
            {i: _FOLD_FLOOR for i in shown if self.columns[i].copy},
            {i: _FOLD_FLOOR for i in shown if not self.columns[i].copy},
        )
        for floor in stages:
            while excess > 0:
                room = [i for i in floor if widths[i] > floor[i]]
                if not room:
                    break
                widths[max(room, key=lambda i: widths[i])] -= 1
                excess -= 1
        return shown, [widths[i] for i in shown]

    def render(self, width: int) -> tuple[Table, list[str]]:
        """The Rich table for a terminal ``width`` wide, and the headers of the columns left out."""
        from rich.table import Table

        shown, widths = self.layout(width)
        table = Table(title=self.title, title_justify="left", show_header=self.show_header)
        for index, size in zip(shown, widths):
            column = self.columns[index]
            table.add_column(column.header, width=size, justify=column.justify, overflow="fold")
        for row in self.rows:
            if row is None:
                table.add_section()
            else:
                table.add_row(*(row[i] for i in shown))
        left_out = [c.header for i, c in enumerate(self.columns) if i not in shown]
        return table, left_out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        """Drawn at the width Rich gives it (the terminal's, or a live view's), then a line naming the columns
        left out and what shows them."""
        from rich.text import Text

        table, left_out = self.render(options.max_width)
        yield table
        if left_out:
            shows = f"a wider terminal or {self.more}" if self.more else "a wider terminal"
            yield Text(
                f"not shown at {options.max_width} columns: {', '.join(left_out)} ({shows} shows them)",
                style="dim",
            )
