#!/usr/bin/env python3
"""Writes the public Python surface of an installed Mooncake wheel as JSON: every public
name of its modules, each class's public methods and attributes, and each callable's
parameter names (from pybind's signature line, or `inspect` for Python code).

Run by hand in a virtual environment holding Mooncake's wheel (never Moongate's):

    ~/.cache/moongate-peers/venv/bin/python kvstore/wheel/tests/dump_mooncake_api.py \
        > kvstore/wheel/tests/mooncake_api.json

`test_api_surface.py` compares Moongate's wheel with the committed file.
"""
import importlib
import inspect
import json
import re
import sys

MODULES = ["mooncake.store", "mooncake.engine", "mooncake.mooncake_config",
           "mooncake.http_metadata_server", "mooncake.mooncake_store_service",
           "mooncake.structured_object_store", "mooncake.buffer_pool", "mooncake.async_store"]


def params(obj):
    """Parameter names of a callable, without `self`; None when they cannot be read."""
    doc = (getattr(obj, "__doc__", None) or "").strip()
    line = doc.splitlines()[0] if doc else ""
    if line.startswith("1. "):  # pybind overloads: the first one
        line = line[3:]
    m = re.match(r"^\w+\((.*)\)( ->.*)?$", line)
    if m and m.group(1) != "*args, **kwargs":
        names = []
        depth, cur = 0, ""
        for ch in m.group(1) + ",":
            if ch in "[(<{":
                depth += 1
            elif ch in "])>}":
                depth -= 1
            if ch == "," and depth == 0:
                name = cur.strip().split(":")[0].split("=")[0].strip()
                if name and name != "self":
                    names.append(name.lstrip("*"))
                cur = ""
            else:
                cur += ch
        return names
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [p for p in sig.parameters if p != "self"]


def describe(obj):
    if inspect.isclass(obj):
        members = {}
        for name in dir(obj):
            if name.startswith("_") and name != "__init__":
                continue
            try:
                attr = getattr(obj, name)
            except Exception:
                continue
            members[name] = {"params": params(attr)} if callable(attr) else {"attribute": True}
        return {"kind": "class", "members": members}
    if callable(obj):
        return {"kind": "function", "params": params(obj)}
    return {"kind": "value"}


def own(obj):
    """Whether a module's name is its own API, not an import (typing, dataclasses, a
    logger): Mooncake's classes and functions, constants and enum values."""
    if inspect.ismodule(obj):
        return False
    if inspect.isclass(obj) or inspect.isroutine(obj):
        return (getattr(obj, "__module__", "") or "").startswith("mooncake")
    if isinstance(obj, (int, float, str, bytes)):
        return True
    return (type(obj).__module__ or "").startswith("mooncake")


out = {}
for mod in MODULES:
    try:
        m = importlib.import_module(mod)
    except Exception as e:  # a module needing what this venv lacks
        out[mod] = {"import_error": f"{type(e).__name__}: {e}"}
        continue
    names = getattr(m, "__all__", None) or [n for n in dir(m) if not n.startswith("_")]
    out[mod] = {n: describe(getattr(m, n)) for n in sorted(names) if own(getattr(m, n, None))}
json.dump(out, sys.stdout, indent=1, sort_keys=True)
print()
