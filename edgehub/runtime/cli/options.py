"""Options in groups: a command's flags given as a table of sections, each with a title and its options, and
shown in ``--help`` under one header per section.

click has no option groups of its own; click-option-group would add them, but as a dependency of every hub (a
Pi Zero's included) for what ``format_options`` and a table do in a few lines. The table is data, so a second
command can take the same flags (``edgehub config show`` takes ``edgehub run``'s) and a test can walk it.

Invariants: every option of the table is a parameter of the command, in the table's order; ``--help`` shows each
option once, under its section (options the table does not name, such as ``--help``, under "Other options").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click

__all__ = ["GroupedCommand", "OptionGroup", "grouped_options", "option"]


@dataclass(frozen=True, slots=True)
class OptionGroup:
    """One section of a command's flags: its title in ``--help`` and its options, in order."""

    title: str
    options: tuple[click.Option, ...]


class GroupedCommand(click.Command):
    """A click command whose ``--help`` lists its options by section (``groups``, set by ``grouped_options``)."""

    groups: tuple[OptionGroup, ...] = ()

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        shown: set[str] = set()
        for group in self.groups:
            rows = [record for option in group.options if (record := option.get_help_record(ctx)) is not None]
            shown.update(option.name for option in group.options if option.name is not None)
            if rows:
                with formatter.section(group.title):
                    formatter.write_dl(rows)
        rest = [
            record
            for param in self.get_params(ctx)
            if param.name not in shown and (record := param.get_help_record(ctx)) is not None
        ]
        if rest:
            with formatter.section("Other options"):
                formatter.write_dl(rest)


def grouped_options(groups: Sequence[OptionGroup]) -> Callable[[click.Command], click.Command]:
    """Give a ``GroupedCommand`` the options of ``groups`` (after any it has) and its sections for ``--help``:
    ``@grouped_options(GROUPS)`` above ``@main.command(cls=GroupedCommand)``."""

    def attach(command: click.Command) -> click.Command:
        if not isinstance(command, GroupedCommand):
            raise TypeError(f"{command.name}: grouped options need cls=GroupedCommand")
        names = [option.name for group in groups for option in group.options]
        if len(names) != len(set(names)):
            raise ValueError(f"{command.name}: an option is in two groups")
        command.params.extend(option for group in groups for option in group.options)
        command.groups = tuple(groups)
        return command

    return attach


def option(*decls: str, **attrs: Any) -> click.Option:
    """A ``click.Option`` for a table row, as ``click.option`` would make it."""
    return click.Option(list(decls), **attrs)
