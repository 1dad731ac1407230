"""--help of a tool: its docstring (usage and examples) and its own flags, in groups.

absl's own help lists the flags of `__main__` under the module's path, which for a console script
is the generated wrapper in the virtualenv's bin/, alphabetically; a tool here names its groups
(`help_groups` of `tfxl.cli.run`): [(heading, flag names)]; its flags in none of them are listed
last, under "other flags".
"""

import inspect
import os
import sys
import textwrap

WIDTH = 100
MORE = ("Also: --flagfile=FILE (flags from a file, also gs://...), --verbosity=1 (TensorFlow's "
        "logs, and the traceback behind an error: line), --helpfull (absl's and TensorFlow's "
        "flags too).")


def describe_flag(flag):
    """A flag as --help lists it: `--name: help` and `(default: ...)`, wrapped."""
    name = f"--[no]{flag.name}" if flag.flag_type() == "bool" else f"--{flag.name}"
    lines = textwrap.wrap(f"{name}: {flag.help}", WIDTH, initial_indent="  ",
                          subsequent_indent="    ", break_on_hyphens=False, break_long_words=False)
    if flag.default not in (None, "", [], ()):
        default = flag.default
        if isinstance(default, (list, tuple)):
            default = ",".join(map(str, default))
        elif isinstance(default, bool):
            default = str(default).lower()
        lines.append(f"    (default: {default})")
    return lines


def tool_help(doc, flag_values, names, groups=()):
    """The help text: `doc` (the tool's module docstring) and the flags `names` of `flag_values`
    under the headings of `groups` ([(heading, names)]), in their order."""
    program = os.path.basename(sys.argv[0])
    text = [inspect.cleandoc(doc) if doc else f"{program} [flags]", ""]
    listed = set()
    sections = [(heading, [n for n in group if n in names]) for heading, group in groups]
    sections.append(("other flags" if groups else "flags",
                     [n for n in names if n not in {n for _, g in groups for n in g}]))
    for heading, members in sections:
        members = [n for n in members if n not in listed]
        if not members:
            continue
        text.append(f"{heading}:")
        for name in members:
            text += describe_flag(flag_values[name])
            listed.add(name)
        text.append("")
    text += textwrap.wrap(MORE, WIDTH)
    return "\n".join(text)
