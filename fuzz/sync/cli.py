"""The ``check-sync`` command line, owned here so ``fuzz/cli.py`` only mounts it.

``add_arguments(parser)`` declares the options on any parser (the ``kvfuzz`` subparser or
a standalone one); ``run(args)`` returns the exit status: 0 clean, 1 findings, 2 usage
error or a path that cannot be read or parsed. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap

from .static import check_paths, config, discover, output, registry
from .static.model import ParseError
from .static.regions import KINDS

EPILOG_HEAD = """\
{entry}

Allowed regions (listed with -v, reported with --strict KIND):
{kinds}

Settings may also live in the checked project's pyproject.toml, [tool.kvfuzz.check-sync]
(paths, roots, extend-roots, select, ignore, strict, exclude, include-tests, output-format).
A line is allowed by `# sync-ok: <reason>`.

Rules:
"""


def _epilog() -> str:
    from .static.vocab import DEFAULT_ROOTS

    kinds = "\n".join(f"  {k:11} {why}" for k, why in KINDS.items())
    entry = textwrap.fill(
        f"Entry points: functions matching a --root pattern (default: {', '.join(DEFAULT_ROOTS)}); a class's "
        "methods are matched on each class that is not abstract, through its MRO. Calls are followed "
        "across the checked tree (imports, super(), base classes).", width=88)
    return EPILOG_HEAD.format(entry=entry, kinds=kinds) + registry.text_table() + (
        "\n\nExit: 0 clean, 1 findings, 2 usage error or unreadable path.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Static check: no host synchronisation on the lazy free path and the read-table build."
    parser.epilog = _epilog()
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="files or directories (default: the config's paths, else kvfuzz's own allocator)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="list entry points, free paths, allowed regions and the syncs they allow")
    parser.add_argument("--output-format", choices=config.FORMATS, help="text (default), json, github or sarif")
    parser.add_argument("--select", action="append", metavar="CODES", help="only these codes or prefixes (comma list)")
    parser.add_argument("--ignore", action="append", metavar="CODES", help="not these codes or prefixes (comma list)")
    parser.add_argument("--root", action="append", metavar="PATTERN",
                        help="another entry point: a name, a glob (free_*) or Class.method; repeatable")
    parser.add_argument("--strict", action="append", metavar="KIND",
                        help=f"report syncs in these allowed regions too: {', '.join(config.STRICT_CHOICES)}")
    parser.add_argument("--include-tests", action="store_true", default=None,
                        help="under a directory, check tests and fixtures too")
    parser.add_argument("--exclude", action="append", metavar="GLOB", help="skip matching paths under a directory")
    parser.add_argument("--config", metavar="PYPROJECT",
                        help="read [tool.kvfuzz.check-sync] from this file (default: the nearest pyproject.toml)")
    parser.add_argument("--list-rules", nargs="?", const="text", choices=("text", "markdown", "json"),
                        help="print the rule registry and exit")
    parser.add_argument("--explain", metavar="CODE", help="print one rule and exit")


def _settings(args) -> config.Settings:
    if args.config:
        settings = config.load(args.config)
    else:
        settings = config.load(config.find_pyproject(args.paths))
    if args.root:
        settings.roots = (*settings.roots, *args.root)
    if args.strict:
        settings.strict = settings.strict | config.strict_kinds(args.strict)
    if args.select:
        settings.select = tuple(args.select)
    if args.ignore:
        settings.ignore = (*settings.ignore, *args.ignore)
    if args.exclude:
        settings.exclude = (*settings.exclude, *args.exclude)
    if args.include_tests:
        settings.include_tests = True
    if args.output_format:
        settings.output_format = args.output_format
    registry.selected_codes(settings.select, settings.ignore)  # a bad code is a usage error, before any work
    return settings


def _list_rules(fmt: str) -> str:
    if fmt == "markdown":
        return registry.markdown_table() + "\n"
    if fmt == "json":
        rules = [{"code": r.code, "name": r.name, "family": registry.family_of(r.code).name, "forms": r.forms,
                  "message": r.message, "why": r.why, "example": r.example, "instead": r.instead}
                 for r in registry.all_rules().values()]
        return json.dumps(rules, indent=1) + "\n"
    return registry.text_table() + "\n"


def run(args) -> int:
    try:
        if args.list_rules:
            sys.stdout.write(_list_rules(args.list_rules))
            return 0
        if args.explain:
            print(registry.explain(args.explain))
            return 0
        settings = _settings(args)
        paths = args.paths or settings.paths
        files = (discover.expand(paths, include_tests=settings.include_tests, exclude=settings.exclude)
                 if paths else discover.default_paths())
    except (config.ConfigError, registry.SelectionError, ParseError) as e:
        print(f"check-sync: error: {e}", file=sys.stderr)
        return 2
    report = check_paths(files, settings)
    for err in report.errors:
        print(f"check-sync: error: {err}", file=sys.stderr)
    fmt = settings.output_format
    if fmt == "json":
        sys.stdout.write(output.render_json(report, settings))
    elif fmt == "sarif":
        sys.stdout.write(output.render_sarif(report))
    elif fmt == "github":
        sys.stdout.write(output.render_github(report, args.verbose))
    else:
        sys.stdout.write(output.render_text(report, args.verbose))
    if report.errors:
        return 2
    return 1 if report.findings else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvfuzz check-sync")
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, or a usage error argparse has already explained
        return e.code if isinstance(e.code, int) else 2
    return run(args)
