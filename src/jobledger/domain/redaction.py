"""Passwords are never printed: any URL in a text is shown with ``***`` for its password.

One helper for every place text reaches a person: the CLI's error line, store errors
(whose messages may quote the driver's), and the URLs the CLI prints.
"""

from __future__ import annotations

import re
from typing import Final

# scheme://user:password@ — the password runs to the last "@" before the host part ends,
# as urlsplit reads it, so a password holding "@" or ":" is hidden whole.
_USERINFO: Final = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s]*):[^/?#\s]*@")


def redact(text: str) -> str:
    """``text`` (a URL, or a message quoting URLs) with every URL's password as ``***``."""
    return _USERINFO.sub(lambda found: f"{found.group('head')}:***@", text)
