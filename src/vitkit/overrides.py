"""One type-checked parser for `--set FIELD=VALUE` overrides of frozen config dataclasses.

Used by `vitkit train`, `finetune`, `pretrain-mpp` (`--set group.field=value` on a TrainConfig) and by
`vitkit bench` (`--set field=value` on a model config).  A value is parsed against the field's type
hint (bool, int, float, str, Literal, tuple, X | None); unknown fields and wrong types are errors that
name the field and what it accepts.  A HybridConfig exposes its own fields and its ViT's as one set.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal

from vitkit.models.configs import HybridConfig

_HYBRID_OWN = ("resnet_layers", "width_factor")  # a HybridConfig's own fields; the rest live in its .vit


def field_hints(obj: Any) -> dict[str, Any]:
    """Field name -> type hint of a config dataclass (a hybrid: its own fields plus its ViT's)."""
    if isinstance(obj, HybridConfig):
        return {**field_hints(obj.vit), **{k: v for k, v in _hints(obj).items() if k in _HYBRID_OWN}}
    return _hints(obj)


def _hints(obj: Any) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(obj)}
    return {k: v for k, v in typing.get_type_hints(type(obj)).items() if k in names}


def replace_fields(obj: Any, values: dict[str, Any]) -> Any:
    """`obj` with `values` applied in one construction, so that joint checks see all of them."""
    if isinstance(obj, HybridConfig):
        inner = {k: v for k, v in values.items() if k not in _HYBRID_OWN}
        outer = {k: v for k, v in values.items() if k in _HYBRID_OWN}
        return dataclasses.replace(obj, vit=dataclasses.replace(obj.vit, **inner), **outer)
    return dataclasses.replace(obj, **values)


def parse_fields(obj: Any, items: dict[str, str], where: str) -> dict[str, Any]:
    """Parse `items` (field -> text) against `obj`'s field types; `where` names the group in errors."""
    hints = field_hints(obj)
    values = {}
    for name, text in items.items():
        if name not in hints:
            raise ValueError(f"--set {where}.{name}: unknown field; {where} has {', '.join(sorted(hints))}")
        values[name] = parse_value(text, hints[name], f"{where}.{name}")
    return values


def apply_fields(obj: Any, items: dict[str, str], where: str) -> Any:
    """`obj` with `items` (field -> text) parsed and applied together."""
    values = parse_fields(obj, items, where)
    return replace_fields(obj, values) if values else obj


def split_item(item: str, form: str = "group.field=value", example: str = "optim.warmup_steps=500") -> tuple[str, str]:
    """ "key=value" -> (key, value), or a ValueError showing the expected form."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--set {item!r}: expected {form}, e.g. {example}")
    return key.strip(), text


def parse_value(text: str, hint: Any, key: str) -> Any:
    """Parse `text` as a value of type `hint` (bool, int, float, str, Literal, tuple, X | None)."""
    text = text.strip()
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and text.lower() in ("none", "null", ""):
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return parse_value(text, arg, key)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(errors[0] if errors else f"--set {key}: cannot parse {text!r}")
    if origin is Literal:
        if text not in [str(a) for a in args]:
            raise ValueError(f"--set {key}={text}: must be one of {', '.join(map(str, args))}")
        return next(a for a in args if str(a) == text)
    if origin is tuple:
        return _parse_tuple(text, args, key)
    if hint is bool:
        if text.lower() in ("true", "1", "yes", "on"):
            return True
        if text.lower() in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"--set {key}={text}: expected true or false")
    if hint in (int, float):
        try:
            value = hint(text)
        except ValueError:
            raise ValueError(f"--set {key}={text}: expected {hint.__name__}") from None
        if not math.isfinite(value):
            raise ValueError(f"--set {key}={text}: expected a finite number")
        return value
    if hint is str:
        return text
    raise ValueError(f"--set {key}: fields of type {hint} cannot be set from the command line")


def _parse_tuple(text: str, args: tuple[Any, ...], key: str) -> tuple[Any, ...]:
    items = [t for t in text.strip("()[]").split(",") if t.strip()]
    item_types = [args[0]] * len(items) if len(args) == 2 and args[1] is Ellipsis else list(args)
    if len(item_types) != len(items):
        raise ValueError(f"--set {key}={text}: expected {len(item_types)} comma-separated values")
    return tuple(parse_value(t, h, key) for t, h in zip(items, item_types))
