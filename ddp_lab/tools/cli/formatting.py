"""How every ``ddp-lab`` help page is laid out: a description per command, every option's
default shown (``--help`` is where a user learns what happens without the option), the
descriptions wrapped here so that ``run --help`` can print its list of demos as written."""

from __future__ import annotations

import argparse
import copy
import textwrap

WIDTH = 79  # a terminal's 80 columns, as argparse wraps its own text


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter,
                    argparse.RawDescriptionHelpFormatter):
    """Defaults as a user types them (``2 4``, not ``[2, 4]``); none for a flag, for None
    (the help says what happens then) or where the help already names its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or "default" in text or not action.option_strings
                or default in (None, False, argparse.SUPPRESS)):
            return text
        return f"{text} (default: %(default)s)".lstrip()

    def _format_action(self, action: argparse.Action) -> str:
        # An option added without help (by a bench module's add_arguments) still shows
        # its default: argparse leaves such an option's help line empty.
        if not action.help and action.option_strings and action.default not in (
                None, False, argparse.SUPPRESS):
            action = argparse.Action(action.option_strings, action.dest, nargs=action.nargs,
                                     default=action.default, help="(default: %(default)s)",
                                     metavar=action.metavar)
        return super()._format_action(action)

    def _expand_help(self, action: argparse.Action) -> str:
        if isinstance(action.default, (list, tuple)):  # as typed: 2 4, not [2, 4]
            action = copy.copy(action)
            action.default = " ".join(map(str, action.default))
        return super()._expand_help(action)


def add_command(sub, name: str, summary: str, description: str,
                **kwargs) -> argparse.ArgumentParser:
    """A subcommand whose one-line ``summary`` shows in its parent's list and whose
    ``description`` (paragraphs split by blank lines) opens its own ``--help``."""
    paragraphs = [textwrap.fill(" ".join(p.split()), WIDTH) for p in description.split("\n\n")]
    return sub.add_parser(name, help=summary, description="\n\n".join(paragraphs),
                          formatter_class=HelpFormatter, **kwargs)
