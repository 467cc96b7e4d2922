"""mkdocs hook: the GRPOConfig reference table, generated from the dataclass fields' help.

`docs/reference/config.md` holds the marker below; this hook replaces it with two tables built
from `dataclasses.fields(GRPOConfig)`, so the field docs are written once (in
`grpo_plugin/config/grpo_config.py`) and cannot drift:

1. every field that `transformers.TrainingArguments` does not have (grpo-plugin's own and TRL's),
   with a column saying whether TRL 1.16's `GRPOConfig` has a field of that name;
2. the `TrainingArguments` fields whose default or help GRPOConfig changes.

The other `TrainingArguments` fields are linked, not listed.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from pathlib import Path

MARKER = "<!-- grpo-config-fields -->"
PAGE = "reference/config.md"


def _trl_field_names() -> set[str] | None:
    """Field names of TRL's GRPOConfig, read from its source (importing trl is slow); None if absent."""
    spec = importlib.util.find_spec("trl")
    if spec is None or spec.origin is None:
        return None
    source = Path(spec.origin).parent / "trainer" / "grpo_config.py"
    if not source.exists():
        return None
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "GRPOConfig":
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    names.add(stmt.target.id)
    return names


def _trl_version() -> str:
    from importlib.metadata import version

    return version("trl")


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def _type(field: dataclasses.Field) -> str:
    kind = (
        field.type if isinstance(field.type, str) else getattr(field.type, "__name__", field.type)
    )
    return f"`{_cell(kind)}`"


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required"
    return f"`{_cell(repr(value))}`"


def config_tables() -> str:
    import transformers

    from grpo_plugin import GRPOConfig

    base = {f.name: f for f in dataclasses.fields(transformers.TrainingArguments)}
    trl = _trl_field_names()
    own, changed = [], []
    for f in dataclasses.fields(GRPOConfig):
        if f.name not in base:
            own.append(f)
        elif f.default != base[f.name].default or f.metadata.get("help") != base[
            f.name
        ].metadata.get("help"):
            changed.append(f)

    trl_col = trl is not None
    head = (
        "| field | type | default |"
        + (f" in TRL {_trl_version()} |" if trl_col else "")
        + " help |"
    )
    rule = "|---|---|---|" + ("---|" if trl_col else "") + "---|"
    lines = [f"### Fields of GRPOConfig ({len(own)})", "", head, rule]
    for f in own:
        trl_cell = (" yes |" if f.name in trl else " no |") if trl_col else ""
        lines.append(
            f"| `{f.name}` | {_type(f)} | {_default(f)} |{trl_cell} {_cell(f.metadata.get('help', ''))} |"
        )
    if not trl_col:
        lines += ["", "(trl is not installed in this build, so the TRL column is left out.)"]
    lines += [
        "",
        f"### TrainingArguments fields with another default or meaning ({len(changed)})",
        "",
        "| field | type | default here | TrainingArguments default | help |",
        "|---|---|---|---|---|",
    ]
    for f in changed:
        lines.append(
            f"| `{f.name}` | {_type(f)} | {_default(f)} | {_default(base[f.name])} | "
            f"{_cell(f.metadata.get('help', ''))} |"
        )
    n_rest = len(base) - len(changed)
    lines += [
        "",
        f"The other {n_rest} fields are `transformers.TrainingArguments`' own, unchanged "
        f"(transformers {transformers.__version__}): see its "
        "[reference](https://huggingface.co/docs/transformers/main_classes/trainer#transformers.TrainingArguments).",
    ]
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 (mkdocs hook signature)
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} lost its marker {MARKER}")
    return markdown.replace(MARKER, config_tables())
