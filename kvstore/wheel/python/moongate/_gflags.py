"""What Mooncake's command lines share on Moongate (``mooncake_master``,
``mooncake_client``): gflags' syntax (``--flag=value``, ``--flag value``, ``-flag``,
``--flag`` / ``--noflag`` for booleans), the ``moongate`` binary, and running it in place of
the script."""

import os
import shutil
import sys


class FlagError(ValueError):
    """A command line Mooncake's program would run, but Moongate cannot run as asked."""


def boolean(name, value):
    v = value.lower()
    if v in ("true", "1", "yes", "t", "y"):
        return True
    if v in ("false", "0", "no", "f", "n"):
        return False
    raise FlagError(f"--{name}: {value!r} is not a boolean")


def truthy(name, value):
    """Whether a flag's value asks for something (a true boolean, or any text)."""
    try:
        return boolean(name, value)
    except FlagError:
        return bool(value.strip())


def parse_flags(argv, known, bools):
    """The flags of ``argv`` as {name: value string}; ``known`` names every flag, ``bools``
    those that take no value."""
    out, i = {}, 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("-") or arg in ("-", "--"):
            raise FlagError(f"unexpected argument {arg!r} (flags only)")
        name, eq, value = arg.lstrip("-").partition("=")
        if not eq and name not in known and name.startswith("no") and name[2:] in bools:
            out[name[2:]] = "false"
            continue
        if name not in known:
            raise FlagError(f"unknown command line flag '{name}'")
        if not eq:
            if name in bools:
                value = "true"
            elif i < len(argv):
                value, i = argv[i], i + 1
            else:
                raise FlagError(f"flag '{name}' is missing its value")
        out[name] = value
    return out


def binary(env="MOONGATE_BIN", name="moongate", install="cargo install --path gateway/moongate"):
    """``$env``, else ``name`` on ``PATH``."""
    path = os.environ.get(env) or shutil.which(name)
    if not path or not os.access(path, os.X_OK):
        raise FlagError(f"the {name} binary was not found: put it on PATH or set {env} ({install})")
    return path


def moongate_binary():
    """``$MOONGATE_BIN``, else ``moongate`` on ``PATH``."""
    return binary()


def run(prog, doc, subcommand, translate, argv=None, program=moongate_binary):
    """Runs ``program() [subcommand]`` with ``translate(argv)``'s arguments in place of this
    process (``--print``: prints the command line instead); 1 and the reason on stderr when
    Moongate cannot run as asked."""
    argv = list(sys.argv[1:] if argv is None else argv)
    show = "--print" in argv
    argv = [a for a in argv if a != "--print"]
    if any(a in ("-h", "--help", "-help", "--helpfull") for a in argv):
        print(doc)
        return 0
    try:
        args, notes = translate(argv)
        cmd = [program(), *([subcommand] if subcommand else []), *args]
    except FlagError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    for n in notes:
        print(f"{prog}: {n}", file=sys.stderr)
    if show:
        print(" ".join(cmd))
        return 0
    sys.stderr.flush()
    os.execv(cmd[0], cmd)
    return 0  # not reached
