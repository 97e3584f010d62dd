"""The drafter families pdraft knows, registered once, and everything that is decided by asking them: the
config class of a kind, which checkpoint layout a config.json is in (`detect_family`) and the conversions
between config.json and typed configs, the layout a drafter is saved in, and the family name `pdraft pull`
reports. Torch-free (pdraft.models.family says why).

Registering a family is one line below: import its spec from its folder. The registry takes every FamilySpec
imported here in the order of the imports (kept by hand, not sorted), which is the order of the recipe's
family keys, of `pdraft recipe explain`, of listings and of the quickstart."""

from __future__ import annotations

from pdraft.errors import PdraftError
from pdraft.models.family import FamilySpec, Registry
from pdraft.models.formats import Layout

# The families, one line each, in registration order.
from pdraft.models.dflash.family import DFLASH  # noqa: E402,F401,I001
from pdraft.models.dspark.family import DSPARK  # noqa: E402,F401
from pdraft.models.dflash2.family import DFLASH2  # noqa: E402,F401
from pdraft.models.eagle3.family import EAGLE3  # noqa: E402,F401

FAMILIES = Registry(value for value in list(globals().values()) if isinstance(value, FamilySpec))


def config_class(kind: str) -> type:
    return FAMILIES.get(kind).config


def config_from_dict(data: dict):
    """A typed config from its `to_dict` form, of the class its `kind` names."""
    if "kind" not in data:
        raise PdraftError("a drafter config without a 'kind' (to_dict writes one)")
    return config_class(data["kind"]).from_dict(data)


# ---- checkpoint layouts ---------------------------------------------------------------------------------
def layout(name: str) -> Layout:
    for known in FAMILIES.layouts:
        if known.name == name:
            return known
    names = [repr(known.name) for known in FAMILIES.layouts]
    raise PdraftError(f"unknown checkpoint layout {name!r}: expected {', '.join(names[:-1])} or {names[-1]}")


def layout_of(data: dict, where: str = "config.json") -> Layout:
    """The layout of a parsed config.json: by its `architectures` first (naming two layouts' is refused, never
    resolved by registration order), then by weaker evidence (a bare
    `dflash_config` is z-lab's; DFlash2's architecture is recognised before that fallback, since running a
    DFlash2 head as a plain DFlash one would silently drop its convolutions and selector)."""
    archs = data.get("architectures") or []
    layouts = FAMILIES.layouts
    named = [known for known in layouts if known.architecture in archs]
    if len(named) > 1:  # which one it is would be a guess, and each reads the fields differently
        raise PdraftError(f"{where} names the architectures of {len(named)} drafter layouts "
                          f"({', '.join(known.architecture for known in named)}); a drafter is one of them",
                          hint="keep the one architecture it was trained as in `architectures`")
    if named:
        return named[0]
    for known in layouts:
        if known.claims(data):
            return known
    for known in layouts:
        reason = known.refuses(archs)
        if reason:
            raise PdraftError(reason)
    expected = [known.architecture for known in layouts]
    raise PdraftError(f"config.json is not a drafter of any family pdraft knows ({FAMILIES.titles()}): "
                      f"architectures {archs} (expected {', '.join(expected[:-1])} or {expected[-1]})")


def detect_family(data: dict) -> str:
    """The name of the layout a parsed config.json is in ("deepspec", "zlab", "dflash2", ...)."""
    return layout_of(data).name


def config_from_json(data: dict, where: str = "config.json"):
    return layout_of(data, where).from_json(data, where)


def config_to_json(cfg, layout_name: str) -> dict:
    return layout(layout_name).to_json(cfg)


def save_layout(cfg, name: str | None = None) -> str:
    """The layout save_drafter writes `cfg` in: `name`, which the family must write, or its default."""
    spec = FAMILIES.of(cfg)
    if name is None:
        return spec.default_layout(cfg)
    layout(name)  # an unknown name is its own error
    allowed = [known.name for known in spec.layouts]
    if name not in allowed:
        raise PdraftError(f"a {cfg.kind} drafter cannot be saved in the {name} layout: {spec.title} drafters are "
                          f"written in the {' or '.join(repr(a) for a in allowed)} layout")
    return name


def family_of(data: dict, where: str = "config.json") -> str:
    """The family name `pdraft pull` reports for a parsed config.json (as load_config will read it): pdraft-<kind>
    for a drafter pdraft wrote, else <publisher>-<kind> (deepspec-dspark, zlab-dflash, zlab-dflash2, ...)."""
    known = layout_of(data, where)
    kind = known.kind_of(data)
    return f"pdraft-{kind}" if data.get("pdraft") else f"{known.origin}-{kind}"


__all__ = ["FAMILIES", "config_class", "config_from_dict", "layout", "layout_of", "detect_family",
           "config_from_json", "config_to_json", "save_layout", "family_of"]
