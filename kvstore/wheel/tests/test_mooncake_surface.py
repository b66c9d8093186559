"""Moongate's wheel against the committed surface of Mooncake 0.3.13.post1's
(`mooncake_api.json`, written by `dump_mooncake_api.py` from Mooncake's own wheel): every
module, name, class member and parameter list is here, or listed in
`mooncake_api_gaps.txt` with the reason it is not. A name listed there that now exists
fails too, so the list only shrinks."""

import importlib
import inspect
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
SURFACE = json.loads((HERE / "mooncake_api.json").read_text())
# Classes that are (or extend) another: their members' gaps are the other's.
ALIASES = {
    "mooncake.async_store.MooncakeDistributedStore": "mooncake.store.MooncakeDistributedStore",
    "mooncake.async_store.MooncakeDistributedStoreAsync": "mooncake.store.MooncakeDistributedStore",
}


def gaps():
    """`name  reason` lines of the gaps file (blank lines and `#` comments skipped)."""
    out = {}
    for line in (HERE / "mooncake_api_gaps.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, why = line.partition(" ")
        assert why.strip(), f"{name}: a gap needs its reason"
        out[name] = why.strip()
    return out


def ours(module):
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def params(obj):
    """Parameter names of one of our callables (pyo3's text signature or `inspect`)."""
    sig = getattr(obj, "__text_signature__", None)
    if sig:
        inner = sig.strip()[1:-1]
        names = [p.strip().split("=")[0].strip().lstrip("*") for p in inner.split(",")]
        return [n for n in names if n and n not in ("$self", "self", "/")]
    try:
        return [p for p in inspect.signature(obj).parameters if p != "self"]
    except (TypeError, ValueError):
        return None


def surface():
    """(qualified name, what Mooncake has, what we have or None) for every name."""
    for module, names in SURFACE.items():
        mod = ours(module)
        yield module, {"kind": "module"}, mod
        if "import_error" in names:
            continue
        for name, d in names.items():
            obj = getattr(mod, name, None) if mod else None
            yield f"{module}.{name}", d, obj
            for member, md in d.get("members", {}).items():
                yield f"{module}.{name}.{member}", md, getattr(obj, member, None) if obj else None


def test_every_mooncake_name_is_here_or_listed_with_its_reason():
    listed = gaps()
    missing = {q for q, _, obj in surface() if obj is None}
    # A missing module or class stands for its names; a member of a class that re-exports
    # or extends another is covered by that class's listing.
    def covered(q):
        for alias, of in ALIASES.items():
            if q.startswith(alias + "."):
                q2 = of + q[len(alias):]
                if any(q2 == g or q2.startswith(g + ".") for g in listed):
                    return True
        return any(q == g or q.startswith(g + ".") for g in listed)
    unlisted = sorted(q for q in missing if not covered(q))
    stale = sorted(g for g in listed if g not in missing and not any(
        m.startswith(g + ".") for m in missing))
    assert unlisted == [], f"{len(unlisted)} names of Mooncake's wheel missing: {unlisted}"
    assert stale == [], f"listed as missing but present (drop them from the gaps file): {stale}"


def same_parameters(want, got):
    """Mooncake's parameters are ours, in order (pybind's unnamed `argN` match any name;
    more parameters here, after Mooncake's, are extensions)."""
    if len(got) < len(want):
        return False
    return all(re.fullmatch(r"arg\d+", w) or w == g for w, g in zip(want, got))


def test_parameters_are_mooncakes():
    listed = gaps()
    wrong = []
    for q, d, obj in surface():
        want = d.get("params")
        if obj is None or want is None or not callable(obj) or q + "()" in listed:
            continue
        if q.endswith(".__init__"):  # constructors: pyo3 shows (*args, **kwargs)
            continue
        got = params(obj)
        if got is not None and not same_parameters(want, got):
            wrong.append(f"{q}: Mooncake {want}, here {got}")
    assert wrong == [], "\n".join(wrong)
