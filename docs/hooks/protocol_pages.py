"""MkDocs hook: one page per protocol family, written from the protocol registry.

Each protocol's section is its registered summary, its module's docstring (the update rule,
the choices made and the paper) and a table of its parameters with their `option(...)` help
texts, so the pages cannot drift from the code. A protocol that no family lists, or a
family that names an unknown protocol, stops the build.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "classical": ("Classical", "The textbook designs every comparison starts from.",
                  ("bsp", "asp", "ssp", "local_sgd", "fedavg", "fedasync")),
    "straggler-tolerant": ("Straggler-tolerant",
                           "Designs that keep fast workers busy while a slow one catches up.",
                           ("esync", "nbsync", "lbbsp", "dssync", "wbsp", "wbsp_opt")),
    "modern": ("Modern descendants",
               "Local-update methods that overlap or stream their communication.",
               ("overlap_local_sgd", "diloco", "streaming_diloco")),
    "federated": ("Federated",
                  "Aggregation rules asked of peer toolkits; FedProx and FedOpt are options "
                  "of these and of local SGD.",
                  ("fedbuff", "fednova", "scaffold")),
    "stale-gradients": ("Stale gradients",
                        "Rules that correct or bound the effect of stale updates.",
                        ("dcasgd", "easgd", "easgd_async")),
}
"""Page slug -> (title, one-line introduction, protocol names in page order)."""


def _registry() -> dict[str, Any]:
    """Every registered protocol (the repository's own package first on the path)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from asyncsync.protocols import discover

    return discover()


def _module_of(protocol: Any) -> Any:
    """The protocol module that registers `protocol` (its own-named module if several)."""
    holders = [module for name, module in sorted(sys.modules.items())
               if name.startswith("asyncsync.protocols.") and module is not None
               and any(value is protocol for value in vars(module).values())]
    own = [m for m in holders if m.__name__.rsplit(".", 1)[1] == protocol.name]
    return (own or holders)[0]


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown(docstring: str) -> str:
    """A module docstring as Markdown: an indented line of ``code`` spans (a displayed
    formula) becomes a paragraph of inline code instead of a code block showing the
    backticks."""
    return re.sub(r"^ {4,}(``)", r"\1", docstring, flags=re.M)


def _parameters(params: type[Any]) -> list[str]:
    """A table of the parameter class's fields, its own first, as `asyncsync protocols`
    prints them (the same helpers)."""
    from asyncsync.study.describe import _own_first, _toml

    rows = _own_first(params)
    if not rows:
        return ["No parameters."]
    table = ["| parameter | default | meaning |", "|---|---|---|"]
    for name, default, text in rows:
        shown = "(unset)" if default is None else _toml(default)
        table.append(f"| `{name}` | `{shown}` | {_cell(text)} |")
    return table


def _section(protocol: Any, described: dict[str, str]) -> list[str]:
    """One protocol's section: summary, how a recipe names it, the rule, the parameters."""
    module = _module_of(protocol)
    path = Path(inspect.getfile(module)).relative_to(ROOT).as_posix()
    summary = protocol.summary.replace("*", "\\*")  # a product, not emphasis
    lines = [f"## `{protocol.name}`", "", f"*{summary}.*", "",
             f'In a recipe: `protocol = "{protocol.name}"`, or a table such as '
             f'`protocol = {{ name = "{protocol.name}", ... }}` with the parameters below. '
             f"Source: `{path}`.", "", "### Rule", ""]
    if module.__name__ in described:
        first = described[module.__name__]
        lines.append(f"The same module as [`{first}`](#{first}): its rule is stated there.")
    else:
        described[module.__name__] = protocol.name
        lines.append(_markdown(inspect.cleandoc(module.__doc__ or "(no module docstring)")))
    lines += ["", "### Parameters", "", *_parameters(protocol.params), ""]
    return lines


def family_pages() -> dict[str, str]:
    """Markdown of every family page, keyed by its path under docs/."""
    registry = _registry()
    listed = [name for _, _, names in FAMILIES.values() for name in names]
    unknown = sorted(set(listed) - set(registry))
    missing = sorted(set(registry) - set(listed))
    twice = sorted({name for name in listed if listed.count(name) > 1})
    if unknown or missing or twice:
        raise ValueError(f"docs/hooks/protocol_pages.py FAMILIES: unknown {unknown}, "
                         f"in no family {missing}, in two families {twice}")
    pages = {}
    for slug, (title, intro, names) in FAMILIES.items():
        described: dict[str, str] = {}
        lines = [f"# {title}", "", intro, "",
                 "This page is generated from the protocol registry when the site is built: "
                 "each rule is its module's docstring and each table its parameter class "
                 "(`asyncsync protocols` prints the same parameters).", ""]
        for name in names:
            lines += _section(registry[name], described)
        pages[f"protocols/{slug}.md"] = "\n".join(lines)
    return pages


def on_files(files: Any, config: Any) -> Any:
    """Add the generated family pages to the site's files."""
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File

    try:
        pages = family_pages()
    except ValueError as exc:
        raise PluginError(str(exc)) from exc
    for path, text in pages.items():
        files.append(File.generated(config, path, content=text))
    return files
