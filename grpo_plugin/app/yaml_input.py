"""The user's YAML (a recipe file, a flag's value, `--dataset '{...}'`), read with a bound on
what it expands to.

YAML aliases let 800 bytes stand for 43 million values (each level of `&a [*b, *b, ...]`
multiplies the one below): such a recipe passed every check and then held 12 GB and wrote
1.9 GB of JSON into every checkpoint. `safe_load` composes the node graph first (an alias is a
reference to its anchor's node, so composing costs what the text costs), counts the values the
graph expands to over its DAG, each node once with its multiplicity (so counting costs no more
than composing), and builds Python objects only when the count is under `MAX_VALUES`. A
recursive alias (a list that holds itself) expands without end and is refused too.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_VALUES = 100_000  # scalars, lists and mappings; a recipe holds a few hundred


class YAMLTooLarge(ValueError):
    """A document that expands past `MAX_VALUES` values (or without end)."""


def expanded_size(node: yaml.Node | None, limit: int = MAX_VALUES) -> int:
    """How many values `node` expands to (a mapping's keys and values, a list's items, itself),
    an alias counted as often as it is used, without expanding it; stops past `limit`."""
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()

    def size(n: yaml.Node) -> int:
        key = id(n)
        if key in sizes:
            return sizes[key]
        if key in in_progress:  # an alias of a node inside itself: no end
            raise YAMLTooLarge("a recursive alias")
        in_progress.add(key)
        total = 1
        if isinstance(n, yaml.SequenceNode):
            children = n.value
        elif isinstance(n, yaml.MappingNode):
            children = [part for pair in n.value for part in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > limit:
                break
        in_progress.discard(key)
        sizes[key] = total
        return total

    return 0 if node is None else size(node)


def safe_load(text: str, where: str = "the YAML", limit: int = MAX_VALUES) -> Any:
    """`yaml.safe_load(text)`, refusing a document that expands to more than `limit` values:
    `YAMLTooLarge` (a ValueError) with one line naming `where`; `yaml.YAMLError` as PyYAML's."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        try:
            size = expanded_size(node, limit)
        except YAMLTooLarge:
            size = limit + 1
        if size > limit:
            raise YAMLTooLarge(
                f"{where}: expands to more than {limit:,} values (YAML aliases?); write the "
                "values out, or use fewer nested aliases"
            )
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()
