"""The configuration reference table, generated from the key declarations.

docs/configuration.md holds the table between two markers; `./dev docs`
regenerates it (`update_config_table`) and a unit test checks it is current.
"""

from __future__ import annotations

from runtime.config.query_settings import QUERY_SETTINGS
from runtime.config.settings import (
    KEYS,
    PASSTHROUGH_ATTRS,
    PASSTHROUGH_DOCS,
    SHARED_SECURITY_DOC,
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def config_table_markdown() -> str:
    """The configuration table (Markdown) of docs/configuration.md, generated from `KEYS`."""
    rows = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for spec in KEYS.values():
        cells = (f"`{spec.name}`", spec.type_doc(), spec.default_doc_text(), spec.doc)
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    for spec in QUERY_SETTINGS.values():
        cells = (f"`{spec.name}`", spec.type_doc(), spec.default_doc_text(), spec.doc)
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    for prefix, attr in PASSTHROUGH_ATTRS:
        cells = (f"`{prefix}*`", "passed through", "", PASSTHROUGH_DOCS[attr])
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    cells = ("`security.protocol`, `sasl.*`, `ssl.*`", "passed through", "", SHARED_SECURITY_DOC)
    rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows) + "\n"


README_TABLE_START = "<!-- config table: generated from runtime/config/ by ./dev docs -->"
README_TABLE_END = "<!-- end of config table -->"


# The page that holds the generated table (the docs site's configuration
# reference; the README links to it and lists only the common keys).
CONFIG_TABLE_PAGE = "docs/configuration.md"


def readme_with_table(text: str) -> str:
    """`text` (a Markdown page: docs/configuration.md) with the config table
    between its markers regenerated. Raises ValueError if a marker is missing."""
    start = text.index(README_TABLE_START) + len(README_TABLE_START)
    end = text.index(README_TABLE_END, start)
    return text[:start] + "\n\n" + config_table_markdown() + "\n" + text[end:]


def update_config_table(path: str = CONFIG_TABLE_PAGE) -> bool:
    """Regenerate the config table in the page at `path` (by default
    docs/configuration.md, relative to the working directory; `./dev docs` runs
    from the repository's root); True if it changed."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    new = readme_with_table(text)
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
    return new != text


def update_readme(path: str = CONFIG_TABLE_PAGE) -> bool:
    """The former name of `update_config_table` (the table was in README.md
    until the docs site); same arguments and result."""
    return update_config_table(path)
