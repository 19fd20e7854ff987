"""Which config keys the run reads: a key given for a kind that does not read it.

Each section's dataclass (hpcdp/config.py) and each strategy's options dataclass
(hpcdp/config_parallel.py) declares, next to its fields, when a key is read::

    APPLIES: ClassVar[dict] = {
        "momentum": ("optim.kind", ("sgd",)),                  # read when optim.kind is "sgd"
        "gelu": [("model.kind", ("gpt",)), ("model.activation", ("gelu",))],   # any of them
    }

A key that is not listed is always read. A selector is a full dotted key
(``"parallel.zero.stage"`` for a strategy's own option). A strategy whose code also
reads another strategy's table names it in ``ALSO_READS: ClassVar[tuple] = ("ddp",)``.
A new section or strategy plugs in with that one declaration; nothing here changes.

The rule (docs/user-guide.md, "Keys that do not apply"), applied by
:func:`hpcdp.config.load_config` to what a user writes (a config file and ``--set``):

- a key of a section that the run does not read is an error when it was given by
  ``--set`` or holds a value other than its default (a resolved ``config.toml``
  carries every key, the unread ones at their defaults, and reruns as it is), unless
  it comes from the config file and ``--set`` switched the setting that leaves it
  unread (``--set train.reproducible=fast`` on an exact job's file that sets
  ``train.exact_micro_batch``): then it is named in the warning line;
- strategy options are different: a shared config file may carry several strategies'
  tables, or the options of every ZeRO stage, and pick one with ``--set
  parallel.strategy=...`` / ``--set parallel.zero.stage=...``. A ``[parallel.<name>]``
  table of a strategy the run does not use, and an option the chosen strategy does
  not read in its setting, are one warning line naming them when they come from the
  config file, and an error when ``--set`` gives them.
"""

from __future__ import annotations

import dataclasses

from hpcdp.config_error import ConfigError


def _rules(cls, key: str) -> list | None:
    rule = getattr(cls, "APPLIES", {}).get(key)
    if rule is None:
        return None
    return [rule] if isinstance(rule, tuple) else list(rule)


def value_at(cfg, path: str):
    """The value of the dotted key ``path`` in a built Config (``parallel.<name>.<key>``
    reads the strategy's options; a missing table reads as None)."""
    parts = path.split(".")
    if parts[0] == "parallel" and len(parts) == 3:
        opts = cfg.parallel.options.get(parts[1])
        return None if opts is None else getattr(opts, parts[2])
    node = cfg
    for p in parts:
        node = getattr(node, p)
    return node


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _why_not(cfg, rules) -> str | None:
    """None when one of ``rules`` holds, else the reason it is not read."""
    if any(value_at(cfg, sel) in values for sel, values in rules):
        return None
    parts = []
    for sel, values in rules:
        allowed = ", ".join(repr(v) for v in values)
        parts.append(f"{sel} is {value_at(cfg, sel)!r} (it is read when {sel} is {allowed})")
    return "; ".join(parts)


def _unread(cfg, obj, prefix: str, set_keys) -> list[tuple[str, str, str]]:
    """``(dotted key, selector, why)`` for each key of ``obj`` that is given (by ``--set``
    or a value other than its default) and not read in this run's setting."""
    out = []
    cls = type(obj)
    for f in dataclasses.fields(obj):
        rules = _rules(cls, f.name) if f.init else None
        if rules is None:
            continue
        path = f"{prefix}.{f.name}"
        if path not in set_keys and getattr(obj, f.name) == _default(f):
            continue
        why = _why_not(cfg, rules)
        if why:
            out.append((path, [sel for sel, _ in rules], why))
    return out


def _refuse(cfg, path: str, selector: str, why: str):
    value = value_at(cfg, path)
    raise ConfigError(f"{path}: {value!r} is not read by this run: {why}; remove {path} "
                      f"or set {selector} to a value that reads it")


def unread_options(cfg, raw: dict, set_keys=()) -> list[tuple[str, str]]:
    """Strategy options this run does not read: ``(dotted key, why)`` for every key of
    another strategy's ``[parallel.<name>]`` table in ``raw``, and for every option of
    the chosen strategy that is given but not read in its setting."""
    set_keys = set(set_keys)
    strategy = cfg.parallel.strategy
    chosen = cfg.parallel.options.get(strategy)
    read = {strategy, *getattr(type(chosen), "ALSO_READS", ())}
    out = []
    for name, opts in sorted(cfg.parallel.options.items()):
        if name in read:
            out += [(path, f"{sels[0]} is {value_at(cfg, sels[0])!r}")
                    for path, sels, _ in _unread(cfg, opts, f"parallel.{name}", set_keys)]
        else:
            keys = sorted((raw.get("parallel") or {}).get(name) or {}) or ["*"]
            out += [(f"parallel.{name}.{k}", f"parallel.strategy is {strategy!r}") for k in keys]
    return out


def check_keys_apply(cfg, raw: dict, set_keys=(), shared_keys=()) -> list[str]:
    """Refuse keys the run does not read (see the module's rule); returns the warning
    lines (at most one) for the strategy options of the config file that the run does
    not read. ``raw``: the dict the config was built from; ``set_keys``: the dotted keys
    ``--set`` gave; ``shared_keys``: those of them that may carry options of several
    strategies (a study's common overrides), which are treated as the file's."""
    set_keys, shared = set(set_keys), set(shared_keys)
    noted: dict[str, list[str]] = {}
    for section in dataclasses.fields(cfg):  # a Config's fields are its sections
        if section.name != "parallel":
            for path, sels, why in _unread(cfg, getattr(cfg, section.name), section.name, set_keys):
                switched = [sel for sel in sels if sel in set_keys]
                if path in set_keys or not switched:
                    _refuse(cfg, path, sels[0], why)
                # the file's key, unread because --set switched its selector: a warning
                noted.setdefault(f"{switched[0]} is {value_at(cfg, switched[0])!r}", []).append(path)
    strategy = cfg.parallel.strategy
    for path, why in unread_options(cfg, raw, set_keys):
        if path in set_keys and path not in shared:
            table = path.rsplit(".", 1)[0]
            if why.startswith("parallel.strategy"):
                raise ConfigError(f"{path}: parallel.strategy is {strategy!r}, which does not read "
                                  f"[{table}]; set parallel.strategy = \"{table.split('.')[1]}\" or remove {path}")
            sel = why.split(" is ")[0]
            _refuse(cfg, path, sel, why)
        noted.setdefault(why, []).append(path)
    if not noted:
        return []
    parts = []
    for why, paths in noted.items():
        if why.startswith("parallel.strategy"):
            tables: dict[str, list[str]] = {}
            for p in paths:
                table, key = p.rsplit(".", 1)
                tables.setdefault(table, []).append(key)
            parts += [f"[{t}]" + (f" ({', '.join(k)})" if k != ["*"] else "") + f" ({why})"
                      for t, k in tables.items()]
        else:
            parts.append(f"{', '.join(paths)} ({why})")
    return [f"warning: the config file's {'; '.join(parts)}: not read by this run "
            "(docs/user-guide.md, \"Keys that do not apply\")"]


__all__ = ["check_keys_apply", "unread_options", "value_at"]
