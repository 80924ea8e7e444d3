"""YAML from someone else, read with a bound: every YAML text raycse reads (configs, search spaces,
``--set`` and flag values, a run's kept ``config.yaml``, an autoscaler config) goes through here.

PyYAML's safe loader runs no code, but aliases let a 1 KB file stand for a billion values (the
"billion laughs": ``a1: [*a0, *a0, ...]`` nine levels deep). PyYAML itself shares the aliased
objects, so the load is cheap; whatever walks the result afterwards (validation, a deep copy, a
dump into a trial's config) expands it. :class:`YamlLoader` counts the aliases and the nodes the
document stands for *after* expansion while composing, before any Python object is built, and
stops at :data:`MAX_ALIASES` / :data:`MAX_EXPANDED_NODES` with :class:`YamlTooLarge`.

Ground floor: no raycse imports.
"""

from __future__ import annotations

import re

import yaml

MAX_ALIASES = 1000  # a hand-written config shares a few settings, not thousands
MAX_EXPANDED_NODES = 100_000  # the largest shipped search space expands to ~300 nodes


class YamlTooLarge(yaml.YAMLError):
    """A YAML document whose aliases expand past the bound (its message is one line)."""


class YamlLoader(yaml.SafeLoader):
    """YAML 1.1 as PyYAML's safe loader reads it, with a bound on aliases and on the expanded size,
    plus exponent floats without a dot (``1e-5``): YAML 1.1 makes them strings, so
    ``lr: {loguniform: [1e-5, 1e-4]}`` was refused as "not numbers"."""

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise YamlTooLarge(f"more than {MAX_ALIASES} aliases (*name)")
        return super().compose_node(parent, index)

    def compose_document(self):
        node = super().compose_document()
        expanded = expanded_size(node, MAX_EXPANDED_NODES)
        if expanded > MAX_EXPANDED_NODES:
            raise YamlTooLarge(f"its aliases expand it past {MAX_EXPANDED_NODES:,} values")
        return node


YamlLoader.add_implicit_resolver("tag:yaml.org,2002:float",
                                 re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                                 list("-+0123456789"))


def expanded_size(root: yaml.Node, limit: int) -> int:
    """How many nodes ``root`` stands for with every alias expanded, counted no further than just past
    ``limit``. An aliased node is one object that several parents hold, so each node's size is
    computed once (children first, no recursion): linear in the document, not in its expansion."""
    sizes: dict[int, int] = {}
    opened: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children = _children(node)
        if children_done or not children:
            sizes[id(node)] = min(limit + 1, 1 + sum(sizes.get(id(c), 0) for c in children))
            continue
        if id(node) in opened:  # an alias inside its own anchor (a: &a [*a]): it never ends
            return limit + 1
        opened.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def _children(node: yaml.Node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def load(text):
    """One YAML document from ``text`` (a string or an open file), bounded as above; raises
    ``yaml.YAMLError`` (:class:`YamlTooLarge` for a bomb) and ``RecursionError`` for deep nesting."""
    return yaml.load(text, Loader=YamlLoader)
