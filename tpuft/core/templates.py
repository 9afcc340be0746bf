"""``data.source_template: "question: {question} context: {context}"``: str.format with names of JSON fields.

One parser for the controller (which checks a recipe's templates before anything runs) and the worker (which
fills them in): ``{a.b}`` reaches into nested objects, and only named fields are allowed, so a template means
the same on both sides. Framework-free.
"""

from __future__ import annotations

import string


class TemplateError(ValueError):
    pass


def template_fields(template: str) -> list[str]:
    """The field names a template uses, in order; :class:`TemplateError` when it is not a valid template."""
    names: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:  # "Single '}' encountered", "expected '}' before end of string"
        raise TemplateError(f"not a valid template: {exc} (write {{{{ and }}}} for literal braces)") from None
    for _, name, spec, _ in parsed:
        if name is None:
            continue
        if name == "" or name.isdigit():
            raise TemplateError(
                "positional fields ({} or {0}) are not allowed: name a field of the data, e.g. {question}"
            )
        if "[" in name or any(part == "" for part in name.split(".")):
            raise TemplateError(f"field {{{name}}}: use field names joined by dots (e.g. {{translation.en}})")
        names.append(name)
        if spec and "{" in spec:
            names.extend(template_fields(spec))
    return names
