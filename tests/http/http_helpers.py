"""A tiny blocking HTTP client for the tests (urllib: nothing to install, nothing hidden)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


@dataclass
class Answer:
    status: int
    text: str
    headers: dict[str, str]

    @property
    def json(self) -> Any:
        return json.loads(self.text)


def request(
    base: str,
    method: str,
    path: str,
    body: Any = None,
    *,
    token: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 15.0,
) -> Answer:
    sent = dict(headers or {})
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        sent["Content-Type"] = "application/json"
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(base + path, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return Answer(r.status, r.read().decode(), dict(r.headers))
    except urllib.error.HTTPError as e:
        return Answer(e.code, e.read().decode(), dict(e.headers))


def get(base: str, path: str, **kwargs: Any) -> Answer:
    return request(base, "GET", path, **kwargs)
