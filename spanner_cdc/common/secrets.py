"""Credentials kept out of what a person or a log file sees.

Connection strings come as URIs (``postgresql://user:password@host/db``) or as keyword strings
(``host=h password=p``); client settings as ``KEY=VALUE``. :func:`redact` hides the secret parts
of any text that may contain them: error messages of client libraries, addresses printed back.
"""

from __future__ import annotations

import re

HIDDEN = "<hidden>"
_URI_PASSWORD = re.compile(r"(?P<head>[A-Za-z][\w+.-]*://[^/@:\s]*:)[^@\s]*(?=@)")
_SECRET_KEYWORD = re.compile(
    r"(?P<head>\b[\w.-]*(?:password|passwd|secret|token|credentials?|jaas\.config)\s*[=:]\s*)"
    r"(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\S+)",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with URI passwords and the values of secret-looking keywords replaced."""
    text = _URI_PASSWORD.sub(lambda m: m.group("head") + HIDDEN, text)
    return _SECRET_KEYWORD.sub(lambda m: m.group("head") + HIDDEN, text)
