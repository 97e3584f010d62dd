"""Typed YAML, read defensively: a YAML document within hard limits (size, nesting depth, nodes once aliases
are expanded, digits of an integer) so that an alias bomb or a deep nest is refused before anything is built;
every key path mapped to its line, keys given twice refused (PyYAML would silently keep the last one); dotted
command-line overrides (`--set train.lr=3e-4`); validation into a pydantic model with one line per problem
naming the file, the line (or the --set that gave the value), the key path, what was expected and what was
found, and the closest known key for a misspelt one; and a description of every field of a model (type,
range, default, description). The machinery only: the schema it reads into is pdraft.recipe's, whose
`load_recipe` and `explain` are thin calls into this module."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from pdraft.errors import PdraftError, RecipeError

# Parsing limits: a recipe is a few kilobytes of plain keys; anything far past these is a mistake or an attack
# (a YAML alias bomb expands a few lines into billions of nodes, deep nesting exhausts the parser's stack).
MAX_RECIPE_BYTES = 1 << 20
MAX_NODES = 100_000  # YAML nodes after alias expansion
MAX_DEPTH = 32
MAX_INT_DIGITS = 20


class TooLarge(Exception):
    """A YAML document past the parsing limits; the message says which."""


def compose(text: str) -> yaml.Node | None:
    """The YAML node graph of `text`, or TooLarge. Composing keeps an alias as a second reference to one
    node, so nothing has been expanded yet; the walk in line_map counts the expansion."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:
        raise TooLarge(f"nested deeper than {MAX_DEPTH} levels") from None


def line_map(root: yaml.Node | None) -> tuple[dict[tuple, int], list[str]]:
    """Map every key path in the YAML document to its 1-based line; also report duplicate keys, which
    PyYAML would otherwise resolve silently by keeping the last one. Raises TooLarge past the limits on
    depth, expanded node count (aliases included), key kind and integer size, before anything is built."""
    lines: dict[tuple, int] = {}
    duplicates: list[str] = []
    count = 0

    def walk(node: yaml.Node, path: tuple) -> None:
        nonlocal count
        count += 1
        if count > MAX_NODES:
            raise TooLarge(f"more than {MAX_NODES} values once aliases are expanded (a YAML alias bomb?)")
        if len(path) > MAX_DEPTH:
            raise TooLarge(f"line {node.start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    raise TooLarge(f"line {key_node.start_mark.line + 1}: a mapping key must be a plain name, "
                                   f"found a {'list' if isinstance(key_node, yaml.SequenceNode) else 'mapping'}")
                key = key_node.value
                if key in seen:
                    duplicates.append(f"line {key_node.start_mark.line + 1}: {dotted(path + (key,))}: key appears twice")
                seen.add(key)
                lines[path + (key,)] = key_node.start_mark.line + 1
                walk(value_node, path + (key,))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines[path + (i,)] = item.start_mark.line + 1
                walk(item, path + (i,))
        elif node.tag == "tag:yaml.org,2002:int" and len(node.value) > MAX_INT_DIGITS:
            raise TooLarge(f"line {node.start_mark.line + 1}: an integer of {len(node.value)} digits")

    if root is not None:
        walk(root, ())
    return lines, duplicates


def bounded_yaml(text: str) -> tuple[Any, dict[tuple, int], list[str]]:
    """(value, key lines, duplicate keys) of a YAML text, checked against the limits before it is built."""
    lines, duplicates = line_map(compose(text))
    return yaml.safe_load(text), lines, duplicates


def load_yaml_text(blob: bytes | str, where: str) -> Any:
    """A YAML document pdraft did not just write (a drafter's recipe.resolved.yaml, pulled or pushed), parsed
    within the recipe's limits (size, depth, values once aliases are expanded), so an alias bomb is refused in
    one line at once instead of growing to gigabytes; a one-line PdraftError for anything else unreadable."""
    if len(blob) > MAX_RECIPE_BYTES:
        raise PdraftError(f"{where} is larger than {MAX_RECIPE_BYTES >> 20} MiB; a resolved recipe is a small YAML file")
    try:
        text = blob.decode("utf-8") if isinstance(blob, bytes) else blob
        return bounded_yaml(text)[0]
    except TooLarge as e:
        raise PdraftError(f"{where} refused: {e}") from None
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise PdraftError(f"{where} is not valid YAML ({type(e).__name__})") from None


def dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path) if path else "<top level>"


def model_at(root: type[BaseModel], path: tuple) -> type[BaseModel] | None:
    model: type[BaseModel] = root
    for part in path:
        field = model.model_fields.get(str(part))
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return None
        model = field.annotation
    return model


def describe_found(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{value!r} ({type(value).__name__})"


def format_error(root: type[BaseModel], err: dict, where: str, lines: dict[tuple, int],
                 overridden: dict[tuple, str]) -> str:
    path = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-after")))
    key = dotted(path)
    if path in overridden:
        loc = f"--set {overridden[path]}"
    else:
        line = next((lines[path[:n]] for n in range(len(path), 0, -1) if path[:n] in lines), None)
        loc = f"{where}:{line}" if line else where
    etype = err["type"]
    if etype == "extra_forbidden":
        model = model_at(root, path[:-1])
        known = list(model.model_fields) if model else []
        close = difflib.get_close_matches(str(path[-1]), known, n=1, cutoff=0.5)
        hint = f"; did you mean '{dotted(path[:-1] + (close[0],))}'?" if close else (
            f"; known keys here: {', '.join(known)}" if known else "")
        return f"{loc}: {key}: unknown key{hint}"
    if etype == "value_error":  # our own validators' messages are whole sentences: show them as they are
        return f"{loc}: {key + ': ' if path else ''}{err['msg'].removeprefix('Value error, ')}"
    # pydantic says "Input should be a valid integer, unable to parse ..."; keep the expectation only.
    expected = err["msg"].removeprefix("Input should be ").split(", unable")[0]
    if etype == "model_type":
        expected = "a mapping of keys"
    elif expected.startswith(("less", "greater")):
        expected = "a value " + expected
    return f"{loc}: {key}: expected {expected}, found {describe_found(err.get('input'))}"


def line_of(problem: str) -> int:
    head = problem.split(": ", 1)[0]
    tail = head.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def parse_override(item: str) -> tuple[tuple[str, ...], Any]:
    """`train.lr=3e-4` -> (("train", "lr"), 0.0003). Values are read as YAML, so lists and null work."""
    if "=" not in item:
        raise RecipeError([f"--set {item}: expected KEY=VALUE with a dotted key, e.g. train.lr=3e-4"])
    key, raw = item.split("=", 1)
    path = tuple(p for p in key.strip().split(".") if p)
    if not path:
        raise RecipeError([f"--set {item}: the key is empty"])
    try:
        value = bounded_yaml(raw)[0] if raw.strip() else None
    except yaml.YAMLError as e:
        raise RecipeError([f"--set {item}: value is not valid YAML ({e.__class__.__name__})"]) from None
    except TooLarge as e:
        raise RecipeError([f"--set {item}: value refused: {e}"]) from None
    # YAML 1.1 reads 3e-4 (no dot) as a string; accept it as the number users mean.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value.lower() for c in ".e") and not value.isalpha() else value
        except ValueError:
            pass
    return path, value


def apply_override(data: dict, path: tuple[str, ...], value: Any, item: str) -> None:
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise RecipeError([f"--set {item}: {dotted(path[: i + 1])} is not a section"])
        node = child
    node[path[-1]] = value


def read_document(path: str | Path) -> tuple[dict, dict[tuple, int]]:
    """(mapping, key lines) of the YAML recipe file at `path`, read within the limits; RecipeError otherwise."""
    p = Path(path)
    if not p.exists():
        raise RecipeError([f"{p}: recipe file not found"])
    if p.is_dir():
        raise RecipeError([f"{p}: is a folder, expected a YAML recipe file"])
    try:
        with p.open("rb") as f:  # bounded: /dev/zero or a multi-gigabyte file is never read whole
            blob = f.read(MAX_RECIPE_BYTES + 1)
        if len(blob) > MAX_RECIPE_BYTES:
            raise RecipeError([f"{p}: larger than {MAX_RECIPE_BYTES >> 20} MiB; a recipe is a small YAML file"])
        text = blob.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RecipeError([f"{p}: cannot read the recipe ({e.__class__.__name__}: {getattr(e, 'strerror', None) or e})"]) from None
    return parse_document(text, str(p))


def parse_document(text: str, where: str) -> tuple[dict, dict[tuple, int]]:
    """(mapping, key lines) of a YAML recipe text, parsed within the limits; RecipeError naming `where`."""
    try:
        data, lines, duplicates = bounded_yaml(text)
    except TooLarge as e:
        raise RecipeError([f"{where}: recipe refused: {e}"]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise RecipeError([f"{where}{line}: malformed YAML: {problem}"]) from None
    if duplicates:
        raise RecipeError([f"{where}:{d.removeprefix('line ')}" for d in duplicates])
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError([f"{where}:1: <top level>: expected a mapping of sections, found {describe_found(data)}"])
    return data, lines


def validate(root: type[BaseModel], data: Any, where: str, lines: dict[tuple, int] | None = None,
             overrides: list[str] | None = None) -> BaseModel:
    """`data` with `overrides` (KEY=VALUE) applied, validated into `root`; RecipeError with one line per problem,
    sorted by line."""
    overridden: dict[tuple, str] = {}
    for item in overrides or []:
        key_path, value = parse_override(item)
        apply_override(data, key_path, value, item)
        overridden[key_path] = item
    try:
        return root.model_validate(data)
    except ValidationError as e:
        problems = [format_error(root, err, where, lines or {}, overridden) for err in e.errors()]
        raise RecipeError(sorted(problems, key=line_of)) from None


def describe(root: type[BaseModel], section: type[BaseModel],
             prefix: str | None = None) -> list[tuple[str, str, str, str]]:
    """(key path, type, default, description) for every field of `root` under `prefix` (a section or a key);
    fields whose annotation is a `section` subclass are walked into."""
    rows: list[tuple[str, str, str, str]] = []

    def type_name(annotation: Any) -> str:
        name = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
        return name or str(annotation).replace("typing.", "")

    def walk(model: type[BaseModel], path: tuple) -> None:
        for name, field in model.model_fields.items():
            key = path + (name,)
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, section):
                walk(ann, key)
                continue
            ops = {"Ge": ">=", "Gt": ">", "Le": "<=", "Lt": "<"}
            bounds = [f"{ops[type(m).__name__]} {getattr(m, type(m).__name__.lower())}" for m in field.metadata
                      if type(m).__name__ in ops]
            typ = type_name(ann) + (f" ({', '.join(bounds)})" if bounds else "")
            rows.append((dotted(key), typ, repr(field.default), field.description or ""))

    walk(root, ())
    if prefix:
        rows = [r for r in rows if r[0] == prefix or r[0].startswith(prefix + ".")]
        if not rows:
            sections = [n for n, f in root.model_fields.items()
                        if isinstance(f.annotation, type) and issubclass(f.annotation, section)]
            keys = [r[0] for r in describe(root, section)] + sections
            close = difflib.get_close_matches(prefix, keys, n=1, cutoff=0.5)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise RecipeError([f"{prefix}: no such recipe section or key{hint}"])
    return rows


__all__ = ["MAX_RECIPE_BYTES", "MAX_NODES", "MAX_DEPTH", "MAX_INT_DIGITS", "TooLarge", "bounded_yaml", "read_document",
           "parse_document",
           "parse_override", "validate", "describe", "dotted"]


# YAML 1.1 (PyYAML's resolver) reads these plain words as booleans, so `compile: off` arrives as False.
YAML_BOOLEAN_WORDS = {True: ("yes", "true", "on"), False: ("no", "false", "off")}


def string_choice_of_boolean(value: Any, choices: tuple) -> Any:
    """The string choice a YAML boolean was written as (`off` -> "off" when "off" is a choice), or `value` as it
    is: a field whose choices are strings takes the spelling the docs use, bare, whatever YAML made of it. A
    boolean two choices could stand for (both "on" and "yes") stays a boolean, refused by the field."""
    if not isinstance(value, bool):
        return value
    words = [c for c in choices if isinstance(c, str) and c.lower() in YAML_BOOLEAN_WORDS[value]]
    return words[0] if len(words) == 1 else value
