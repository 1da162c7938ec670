"""The ``loongsage`` command: one entry point, one subcommand per job.

The run's own jobs (``plugins``, ``config``, ``train``, ``sft``, ``serve``; ``--version``) are
parsed here; ``-v``/``-q`` before the subcommand set the level of the ``loongsage`` loggers. Every other subcommand is a ``command`` plugin (``loongsage_register_commands``:
core's ``models``, loongsage-sandbox's ``sandbox``, any third party's), found in the
registries and called as ``main(argv, registries)``, so core never names a plugin package; an error it
raises is printed as one line (its traceback with ``-v``).
This module is the entry point: it loads the process's registries (``get_registries``)
and hands them down.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import traceback
from typing import Sequence

from loongsage import __version__
from loongsage.catalogue import install_hint
from loongsage.engines.openmp_wait import openmp_wait_env
from loongsage.errors import LoongSageError
from loongsage.logs import configure_logging
from loongsage.plugins import get_registries
from loongsage.registry import KINDS, Registries


GLOBAL_FLAGS = {"-v": 1, "--verbose": 1, "-q": -1, "--quiet": -1}
INTERRUPTED = 130  # the exit status of a run stopped at once (128 + SIGINT, as shells report it)


def config_groups_help(registries: Registries) -> str:
    """Every config group with its options, for the epilog of the commands taking a recipe."""
    from loongsage.config.compose import list_recipes
    from loongsage.config.store import PLUGIN_GROUPS

    lines = ["config groups (select with GROUP=OPTION; the others name a plugin in the field shown):"]
    for group in PLUGIN_GROUPS.values():
        names = ", ".join(e.name for e in registries[group.kind]) or "(none registered)"
        how = "" if group.selectable else f"  [{group.field}" + (
            f".{group.name_field}" if group.name_field else "") + "=NAME]"
        lines.append(f"  {group.group}{how}\n      {names}")
    lines += ["", "recipes: " + ", ".join(list_recipes()),
              "parameters of one group's options: loongsage config show --group GROUP"]
    return "\n".join(lines)


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config-name", "-cn", required=True, help="recipe, e.g. tiny/grpo")
    parser.add_argument("--config-dir", "-cd", default=None, help="folder with your own recipes")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides: key=value, group=option")


def build_parser(registries: Registries) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loongsage", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"loongsage {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more output (debug logs)")
    parser.add_argument("-q", "--quiet", action="count", default=0, help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", required=True)
    recipe_command = {"epilog": config_groups_help(registries),
                      "formatter_class": argparse.RawDescriptionHelpFormatter}

    plugins = sub.add_parser("plugins", help="list registered plugins")
    plugins.add_argument("kind", nargs="?", choices=sorted(KINDS), help="one kind, with parameters")
    plugins.add_argument("--json", action="store_true", help="machine-readable list")

    config = sub.add_parser("config", help="inspect configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser(
        "show", help="print the resolved, validated config, or the options of one config group")
    show.add_argument("--config-name", "-cn", default=None, help="recipe, e.g. tiny/grpo")
    show.add_argument("--config-dir", "-cd", default=None, help="folder with your own recipes")
    show.add_argument("--group", "-g", default=None,
                      help="list this group's options with typed parameters, e.g. algorithm/policy_loss")
    show.add_argument("--doc", action="store_true", help="one key a line, with its description from the schema")
    show.add_argument("overrides", nargs="*", help="Hydra overrides: key=value, group=option")
    config_sub.add_parser("recipes", help="list bundled recipes")

    _add_config_args(sub.add_parser("train", help="run RL training", **recipe_command))
    _add_config_args(sub.add_parser("sft", help="run the supervised warm start only", **recipe_command))
    serve = sub.add_parser("serve", help="start engine(s) and the AgentFlow router; print base URLs",
                           **recipe_command)
    _add_config_args(serve)
    serve.add_argument("--engine-url", action="append", default=None,
                       help="use this running engine instead of starting one (repeatable)")
    serve.add_argument("--session-header", default=None, metavar="HEADER",
                       help="one trajectory per value of this request header under each key "
                            "(x-session-id: one per verifiers rollout)")
    for entry in registries.command:
        command = sub.add_parser(entry.name, help=f"{entry.doc} (from {entry.distribution})", add_help=False)
        command.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _plugin_rows(registries: Registries, kind: str | None) -> list[dict]:
    kinds = [kind] if kind else list(KINDS)
    return [
        {
            "kind": k,
            "name": e.name,
            "distribution": e.distribution,
            "doc": e.doc,
            "params": e.param_schema(),
        }
        for k in kinds
        for e in registries[k]
    ]


def cmd_plugins(args: argparse.Namespace, registries: Registries) -> int:
    rows = _plugin_rows(registries, args.kind)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    kinds = [args.kind] if args.kind else list(KINDS)
    for kind in kinds:
        entries = [r for r in rows if r["kind"] == kind]
        print(f"{kind} ({len(entries)})")
        for row in entries:
            print(f"  {row['name']:<28} {row['distribution']:<22} {row['doc']}")
            if args.kind:
                for p in row["params"]:
                    print(f"      {p['name']}: {p['type']} = {p['default']!r}")
    return 0


def _print_group(group_path: str, registries: Registries) -> None:
    from loongsage.config.store import PLUGIN_GROUPS, publish_plugin_params, stored_options

    publish_plugin_params(registries)
    group = PLUGIN_GROUPS[group_path]
    how = (f"pick one: {group.group}=NAME" if group.selectable
           else f"name one in {group.field}" + (f".{group.name_field}" if group.name_field else ""))
    print(f"{group.group}  ({group.kind} options of {group.field}; {how})")
    for name, params in stored_options(group.group).items():
        if name not in registries[group.kind]:  # stored by another load in this process (tests)
            continue
        entry = registries[group.kind].entry(name)
        print(f"  {name:<28} {entry.distribution:<22} {entry.doc}")
        for p in params:
            default = "required" if p.required else repr(p.default)
            print(f"      {p.name}: {p.type} = {default}")


def cmd_config(args: argparse.Namespace, registries: Registries) -> int:
    from omegaconf import OmegaConf

    from loongsage.config.compose import list_recipes, load_config, unknown_group_error
    from loongsage.config.store import PLUGIN_GROUPS
    from loongsage.errors import ConfigError

    if args.config_command == "recipes":
        print("\n".join(list_recipes()))
        return 0
    if args.group is not None and args.group not in PLUGIN_GROUPS:
        raise unknown_group_error(args.group, "--group")
    if args.config_name is None:
        if args.group is None or args.overrides:
            raise ConfigError("--config-name", "required, except for listing a group alone (--group GROUP)")
        _print_group(args.group, registries)
        return 0
    run = load_config(args.config_name, args.overrides, args.config_dir, registries=registries)
    if args.group is not None:
        _print_group(args.group, run.registries)
    elif args.doc:
        from loongsage.config.docs import documented_lines, plugin_refs

        print("\n".join(documented_lines(run.cfg, plugin_refs(run))))
    else:
        print(OmegaConf.to_yaml(run.cfg))
    return 0


def cmd_train(args: argparse.Namespace, registries: Registries) -> int:
    from loongsage.config.compose import load_config

    # the config is validated before the controller (Ray, the engines) is imported, so a config
    # error comes back as fast as from `config show`; the plugins are the ones main() loaded
    run = load_config(args.config_name, args.overrides, args.config_dir, registries=registries)
    from loongsage.controller import run_training

    run_training(run)
    return 0


def cmd_sft(args: argparse.Namespace, registries: Registries) -> int:
    from loongsage.config.compose import load_config

    run = load_config(args.config_name, args.overrides, args.config_dir, registries=registries)  # before the controller
    from loongsage.controller import run_sft_only

    run_sft_only(run)
    return 0


def cmd_serve(args: argparse.Namespace, registries: Registries) -> int:
    from loongsage.controller.serve import run_serve

    run_serve(args.config_name, args.overrides, args.config_dir, args.engine_url, registries=registries,
              session_header=args.session_header)
    return 0


HANDLERS = {
    "plugins": cmd_plugins,
    "config": cmd_config,
    "train": cmd_train,
    "sft": cmd_sft,
    "serve": cmd_serve,
}


def _verbosity(argv: list[str]) -> tuple[int, list[str]]:
    """The ``-v``/``-q`` flags before the subcommand (summed) and the arguments after them."""
    level, i = 0, 0
    while i < len(argv) and argv[i] in GLOBAL_FLAGS:
        level += GLOBAL_FLAGS[argv[i]]
        i += 1
    return level, argv[i:]


def run_command(name: str, argv: list[str], registries: Registries, verbosity: int) -> int:
    """A registered subcommand; what it raises is one line on stderr (a traceback with -v)."""
    try:
        return int(registries.command.get(name)(argv, registries) or 0)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as err:
        if verbosity > 0:
            traceback.print_exc()
        what = str(err) if isinstance(err, LoongSageError) else f"{type(err).__name__}: {err}"
        print(f"error: loongsage {name}: {what}", file=sys.stderr)
        return 2 if isinstance(err, LoongSageError) else 1


def main(argv: Sequence[str] | None = None, registries: Registries | None = None) -> int:
    """``loongsage ARGS``; ``registries`` defaults to the process's (embedding callers pass theirs)."""
    os.environ.update(openmp_wait_env(os.environ))  # before torch loads its OpenMP runtime
    argv = list(sys.argv[1:] if argv is None else argv)
    verbosity, rest = _verbosity(argv)
    configure_logging(verbosity)
    try:
        registries = registries if registries is not None else get_registries()
        if rest and rest[0] not in HANDLERS and rest[0] in registries.command:
            return run_command(rest[0], rest[1:], registries, verbosity)
        hint = install_hint("command", rest[0]) if rest else ""
        if hint and rest[0] not in registries.command:
            print(f"error: loongsage {rest[0]}:{hint}", file=sys.stderr)
            return 2
        args = build_parser(registries).parse_args(argv)
        return HANDLERS[args.command](args, registries)
    except LoongSageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # a second SIGINT/SIGTERM in a run (stop_request), or one before it started
        print(f"interrupted: {str(err) or 'stopped at once, before the run could save a step'}", file=sys.stderr)
        return INTERRUPTED


def console() -> None:
    """The ``loongsage`` command: ``main``, then exit with its status. After an interrupt the
    process ends without the interpreter's teardown: a Ctrl-C that landed inside a C extension's
    import (Ray imports pyarrow in the driver after ``ray.init``) leaves that extension half made,
    and its teardown crashed the process with SIGSEGV after the one-line message. Everything the
    run opened was closed on the way out of ``main``; Ray's daemons go with the driver
    (``controller.ray_sessions``). Any other status exits the usual way (threads joined, exit
    hooks run, Ray's shutdown among them), but with every object alive frozen out of the garbage
    collector first: the interpreter's final collection over a run's imports (torch,
    transformers, Ray) took 1.1-2.6 s after every run on a loaded 2-core machine, to free memory the
    process hands back anyway. Objects are still freed by reference count, and nothing of the run
    depended on that collection: Python does not promise that ``__del__`` runs at exit."""
    status = main()
    if status == INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    gc.freeze()  # the interpreter's last collection skips all that is alive now (see above)
    sys.exit(status)


if __name__ == "__main__":
    console()
