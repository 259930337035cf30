#!/usr/bin/env python3
"""Reference renderer for tests/text/test_jinja.cpp: renders chat templates with Jinja2 exactly the
way Hugging Face transformers' apply_chat_template does (utils/chat_template_utils.py):

    ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                  extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...)
    globals["raise_exception"], globals["strftime_now"]

The context is rendered as given (transformers itself adds tools=None and documents=None when the
caller has none; the conversation corpus spells that out where it matters).

Usage:
    jinja_ref.py TEMPLATE CONTEXT.json [--no-trim-blocks] [--no-lstrip-blocks]
        prints the rendering; on a template error prints "ERROR <type>: <message>" to stderr, exit 1
    jinja_ref.py --batch JOBS.json
        JOBS is a list of {"template": path, "context": path, "trim_blocks": bool, "lstrip_blocks": bool};
        prints a JSON list of {"ok": true, "out": str} or {"ok": false, "error": str}
Exit 3 when jinja2 cannot be imported (the C++ test then reports Skipped).
"""
import json
import sys
from datetime import datetime

try:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:  # pragma: no cover
    print(f"jinja2 is not installed: {e}", file=sys.stderr)
    sys.exit(3)


class AssistantTracker(Extension):
    """transformers' {% generation %} block; it only records offsets, the text is unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers overrides Jinja's tojson, which escapes HTML characters.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def make_env(trim_blocks=True, lstrip_blocks=True):
    env = ImmutableSandboxedEnvironment(
        trim_blocks=trim_blocks,
        lstrip_blocks=lstrip_blocks,
        extensions=[AssistantTracker, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(template_path, context_path, trim_blocks=True, lstrip_blocks=True):
    with open(template_path, encoding="utf-8", newline="") as f:
        source = f.read()
    with open(context_path, encoding="utf-8") as f:
        context = json.load(f)
    return make_env(trim_blocks, lstrip_blocks).from_string(source).render(**context)


def main():
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--batch":
        with open(args[1], encoding="utf-8") as f:
            jobs = json.load(f)
        results = []
        for job in jobs:
            try:
                out = render(job["template"], job["context"], job.get("trim_blocks", True), job.get("lstrip_blocks", True))
                results.append({"ok": True, "out": out})
            except Exception as e:  # any template error: the C++ side must fail too
                results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
        sys.stdout.write(json.dumps(results, ensure_ascii=True))
        return 0
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        out = render(args[0], args[1], "--no-trim-blocks" not in args, "--no-lstrip-blocks" not in args)
    except Exception as e:
        print(f"ERROR {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
