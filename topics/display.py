"""How the console's lists show a topic path."""

from __future__ import annotations

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe


def breakable_path(path: str | None) -> SafeString | str:
    """The path with a line-break opportunity (``<wbr>``) after each inner slash: a narrow
    list column wraps ``/demo/long_topic_name/levels`` between its levels, never inside a
    name, and a copied path is unchanged (``<wbr>`` is no character)."""
    if not path:
        return "-"
    text = escape(path)
    return mark_safe(text[:1] + text[1:].replace("/", "/<wbr>"))
