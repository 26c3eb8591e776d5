"""Credentials kept out of what a person or a log file sees.

Connection strings come as URIs (``postgresql://user:password@host/db``) or as keyword strings
(``host=h password=p``); client settings as ``KEY=VALUE``. :func:`redact` hides the secret parts
of any text that may contain them: error messages of client libraries, addresses printed back.
"""

from __future__ import annotations

import re

HIDDEN = "<hidden>"
#: ``scheme://user:password@host``: the password runs to the authority's last ``@``, so one that
#: holds an ``@`` itself is hidden whole.
_URI_PASSWORD = re.compile(r"(?P<head>[A-Za-z][\w+.-]*://[^/@:\s]*:)[^\s/]*(?=@[^@/\s]*)")
_SECRET_KEYWORD = re.compile(
    r"(?P<head>\b[\w.-]*(?:password|passwd|secret|token|credentials?|jaas\.config|user\.info"
    r"|(?:api|access|private|secret|client)[_.-]?key)\s*[=:]\s*)"
    r"(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\S+)",
    re.IGNORECASE,
)
#: An HTTP ``Authorization`` header or setting: its scheme word and its credentials.
_AUTHORIZATION = re.compile(
    r"(?P<head>\bauthorization\s*[=:]\s*)(?:(?:basic|bearer|digest|negotiate)\s+)?\S+", re.IGNORECASE
)


def redact(text: str) -> str:
    """``text`` with URI passwords and the values of secret-looking keywords replaced."""
    text = _URI_PASSWORD.sub(lambda m: m.group("head") + HIDDEN, text)
    text = _AUTHORIZATION.sub(lambda m: m.group("head") + HIDDEN, text)
    return _SECRET_KEYWORD.sub(lambda m: m.group("head") + HIDDEN, text)
