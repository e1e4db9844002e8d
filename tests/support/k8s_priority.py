"""`RecordedCluster` with the scheduling API's PriorityClasses (the warm pool's): get, create, 403 on demand."""

from __future__ import annotations

import json
import re
from urllib.parse import unquote, urlparse

from tests.support.k8s_api import RecordedCluster, _body, _Response, _status

_PRIORITY = re.compile(r"/apis/scheduling\.k8s\.io/v1/priorityclasses(?:/([^/]+))?")


class PriorityCluster(RecordedCluster):
    """A recorded cluster that also serves `scheduling.k8s.io/v1` PriorityClasses.

    Attributes:
        priority_classes: the cluster-scoped PriorityClasses there are.
        forbidden_priority: the verbs ("get", "create") SAT's account may not use on them (403).
    """

    def __init__(self, *args, priority_classes=(), forbidden_priority=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.priority_classes = list(priority_classes)
        self.forbidden_priority = set(forbidden_priority)

    def request(self, method, url, fields=None, body=None, headers=None, **kwargs) -> _Response:
        path = unquote(urlparse(url).path)
        match = _PRIORITY.fullmatch(path)
        if not match:
            return super().request(method, url, fields=fields, body=body, headers=headers, **kwargs)
        self.requests.append((method, path, {}, _body(body) if body else None))
        name = match.group(1)
        verb = {"GET": "get", "POST": "create", "DELETE": "delete"}.get(method, method.lower())
        if verb in self.forbidden_priority:
            return _status(403, "Forbidden", f'priorityclasses.scheduling.k8s.io is forbidden: cannot {verb}')
        found = [p for p in self.priority_classes if p["metadata"]["name"] == name] if name else []
        if method == "GET" and name:
            return _Response(200, json.dumps(found[0])) if found else _status(
                404, "NotFound", f'priorityclasses.scheduling.k8s.io "{name}" not found')
        if method == "POST" and name is None:
            created = json.loads(json.dumps(_body(body)))
            if any(p["metadata"]["name"] == created["metadata"]["name"] for p in self.priority_classes):
                return _status(409, "AlreadyExists", f'priorityclasses "{created["metadata"]["name"]}" already exists')
            self.priority_classes.append(created)
            self.created.append(("PriorityClass", created))
            return _Response(201, json.dumps(created))
        return _status(404, "NotFound", f"no route {method} {path}")
