"""A Kubernetes API server in memory, behind the real `kubernetes` client: recorded cases and a tiny kubelet.

`RecordedCluster` stands in for the client's urllib3 pool manager (`rest_client.pool_manager`),
so the real `CoreV1Api` builds every request (its own models, serialised) and parses every
answer; every request is recorded with its method, path, query and body. It serves what
the tests need of the core API: pods, services, events, persistent volume claims, secrets
(list, get, create, patch, delete, deletecollection), network policies, nodes (get, list), pod logs (plain or followed; `tailLines`, `sinceSeconds`,
`timestamps`, `limitBytes` as the kubelet applies them). With `kubelet`
set, a created pod "runs" at once: it gets a node, a log and a terminated state
(`kubelet(pod) -> (exit code, log text)`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlparse

from kubernetes.client import ApiClient

_REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 409: "Conflict",
            500: "Internal Server Error"}
_KINDS = {"pods": "Pod", "services": "Service", "events": "Event", "persistentvolumeclaims": "PersistentVolumeClaim",
          "secrets": "Secret", "localqueues": "LocalQueue", "networkpolicies": "NetworkPolicy"}
_ROUTE = re.compile(r"(?:/api/v1|/apis/kueue\.x-k8s\.io/v1beta1|/apis/networking\.k8s\.io/v1)/namespaces/([^/]+)/"
                    r"(pods|events|services|persistentvolumeclaims|secrets|localqueues|networkpolicies)"
                    r"(?:/([^/]+))?(/log)?")
Kubelet = Callable[[dict], "tuple[int, str]"]


class _Response:
    """What urllib3 hands the kubernetes client's REST layer (also streamed, for followed logs)."""

    def __init__(self, status: int, body: str | bytes, content_type: str = "application/json"):
        self.status, self.reason = status, _REASONS[status]
        self.data = body if isinstance(body, bytes) else body.encode()
        self.headers = {"content-type": content_type}

    def getheaders(self):
        return self.headers

    def getheader(self, name, default=None):
        return self.headers.get(name.lower(), default)

    def stream(self, amt=None, decode_content=True):
        yield self.data

    def close(self):
        pass

    def release_conn(self):
        pass


def _status(code: int, reason: str, message: str) -> _Response:
    return _Response(code, json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                       "message": message, "reason": reason, "code": code}))


def _matches(labels: dict, selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        if term.startswith("!"):
            if term[1:] in labels:
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        else:
            key, value = term.split("=", 1)
            if labels.get(key) != value:
                return False
    return True


def _field(obj: dict, path: str):
    for part in path.split("."):
        obj = (obj or {}).get(part)
    return obj


def _epoch(stamp: str) -> float:
    """An RFC 3339 time with up to nanoseconds as seconds since the epoch (microseconds kept)."""
    whole, _, rest = stamp.partition(".")
    fraction = re.match(r"\d*", rest).group() if rest else ""
    zone = stamp[len(whole) + (1 + len(fraction) if rest else 0):]
    return datetime.fromisoformat(whole + (zone.replace("Z", "+00:00") or "+00:00")).timestamp() + float(
        f"0.{fraction or 0}")


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _body(body) -> dict:
    return json.loads(body) if isinstance(body, (str, bytes)) else body


class RecordedCluster:
    """The API server behind a real CoreV1Api: pods, services, claims, events, nodes and logs (and Kueue's LocalQueues).

    Attributes:
        requests: every request as (method, path, query, body).
        created: the body of every successful create, in order, as (kind, body).
    """

    def __init__(self, pods=(), events=(), nodes=(), logs=None, services=(), claims=(), forbidden_namespaces=(),
                 kubelet: Kubelet | None = None):
        self.pods, self.events, self.nodes = list(pods), list(events), list(nodes)
        self.services, self.claims = list(services), list(claims)
        self.secrets: list[dict] = []
        self.local_queues: list[dict] = []  # Kueue's LocalQueues (kueue.x-k8s.io/v1beta1), with their status
        self.network_policies: list[dict] = []  # networking.k8s.io/v1
        self.logs = dict(logs or {})
        self.forbidden_namespaces = set(forbidden_namespaces)
        self.kubelet = kubelet
        self.requests: list[tuple[str, str, dict, dict | None]] = []
        self.now: float | None = None  # the kubelet's clock (`sinceSeconds` counts back from it); None: the real one
        self.created: list[tuple[str, dict]] = []

    @classmethod
    def from_case(cls, folder: Path) -> RecordedCluster:
        """A cluster holding a recorded case (`pods.json`, `events.json`, `nodes.json`, `logs/<pod>.log`)."""
        items = lambda file: json.loads((folder / file).read_text())["items"]
        logs = {p.stem: p.read_text() for p in (folder / "logs").glob("*.log")} if (folder / "logs").exists() else {}
        return cls(items("pods.json"), items("events.json"), items("nodes.json"), logs)

    def api_client(self) -> ApiClient:
        """An ApiClient whose HTTP layer is this cluster (what KubernetesHook.get_conn returns)."""
        from kubernetes.client import Configuration

        api = ApiClient(Configuration(host="https://k8s.test"))
        api.rest_client.pool_manager = self
        return api

    def client(self):
        from kubernetes.client import CoreV1Api

        return CoreV1Api(self.api_client())

    def objects(self, kind: str) -> list[dict]:
        return {"pods": self.pods, "events": self.events, "services": self.services,
                "persistentvolumeclaims": self.claims, "secrets": self.secrets,
                "localqueues": self.local_queues, "networkpolicies": self.network_policies}[kind]

    # ---- the kubelet ---------------------------------------------------------------------------
    def _run(self, pod: dict) -> None:
        exit_code, log = self.kubelet(pod)
        name = pod["metadata"]["name"]
        pod.setdefault("spec", {})["nodeName"] = pod["spec"].get("nodeName") or "node-1"
        containers = [c["name"] for c in pod["spec"].get("containers", [])]
        terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                      "startedAt": "2026-12-01T08:00:00Z", "finishedAt": "2026-12-01T08:00:05Z"}
        pod["status"] = {"phase": "Succeeded" if exit_code == 0 else "Failed", "startTime": "2026-12-01T08:00:00Z",
                         "containerStatuses": [{"name": c, "ready": False, "restartCount": 0, "image": "x",
                                                "imageID": "", "state": {"terminated": terminated}}
                                               for c in containers]}
        self.logs[name] = log

    # ---- pod logs ------------------------------------------------------------------------------
    def _log(self, log: str | list[tuple[str, str]], query: dict) -> bytes:
        """A pod log as the kubelet serves it: the last `tailLines`, then those since `sinceSeconds` before `now`,
        stamped with `timestamps=true`, then the first `limitBytes` bytes. A log given as text has no
        timestamps (every line counts as written now); as (RFC 3339 time, line) pairs it has."""
        entries = [(None, line) for line in log.splitlines()] if isinstance(log, str) else list(log)
        entries = entries[-int(query.get("tailLines", 10**9)):] if "tailLines" in query else entries
        now = time.time() if self.now is None else self.now
        if "sinceSeconds" in query:
            since = now - int(query["sinceSeconds"])
            entries = [(at, line) for at, line in entries if at is None or _epoch(at) >= since]
        stamped = query.get("timestamps") in ("True", "true")
        body = "".join((f"{at or _rfc3339(now)} " if stamped else "") + line + "\n" for at, line in entries)
        data = body.encode()
        return data[:int(query["limitBytes"])] if "limitBytes" in query else data

    # ---- the API -------------------------------------------------------------------------------
    def request(self, method, url, fields=None, body=None, headers=None, **kwargs) -> _Response:
        parsed = urlparse(url)
        query = dict(parse_qsl(parsed.query))
        query.update({k: str(v) for k, v in (fields or [])})
        path = unquote(parsed.path)
        self.requests.append((method, path, query, _body(body) if body else None))
        node = re.fullmatch(r"/api/v1/nodes/([^/]+)", path)
        if node and method == "GET":
            found = [n for n in self.nodes if n["metadata"]["name"] == node.group(1)]
            return _Response(200, json.dumps(found[0])) if found else _status(
                404, "NotFound", f'nodes "{node.group(1)}" not found')
        if path == "/api/v1/nodes" and method == "GET":
            return _Response(200, json.dumps({"apiVersion": "v1", "kind": "NodeList", "metadata": {},
                                              "items": self.nodes}))
        match = _ROUTE.fullmatch(path)
        if not match:
            return _status(404, "NotFound", f"no route {method} {path}")
        namespace, kind, name, log = match.groups()
        if namespace in self.forbidden_namespaces:
            return _status(403, "Forbidden", f'{kind} is forbidden in the namespace "{namespace}"')
        store = self.objects(kind)
        here = [o for o in store if (o["metadata"].get("namespace") or namespace) == namespace]
        found = [o for o in here if o["metadata"]["name"] == name] if name else []
        if method == "GET" and log:
            if name not in self.logs:
                return _status(400, "BadRequest",
                               f'container "base" in pod "{name}" is waiting to start: trying and failing to pull image')
            return _Response(200, self._log(self.logs[name], query), "text/plain")
        if method == "GET" and name is None:
            selected = [o for o in here if _matches(o["metadata"].get("labels") or {}, query.get("labelSelector", ""))]
            for term in filter(None, query.get("fieldSelector", "").split(",")):
                if "!=" in term:
                    key, value = term.split("!=", 1)
                    selected = [o for o in selected if _field(o, key) != value]
                else:
                    key, value = term.split("=", 1)
                    selected = [o for o in selected if _field(o, key) == value]
            return _Response(200, json.dumps({"apiVersion": "v1", "kind": f"{_KINDS[kind]}List", "metadata": {},
                                              "items": selected}))
        if method == "GET":
            return _Response(200, json.dumps(found[0])) if found else _status(404, "NotFound",
                                                                               f'{kind} "{name}" not found')
        if method == "POST" and name is None:
            created = json.loads(json.dumps(_body(body)))
            created["metadata"].setdefault("namespace", namespace)
            if any(o["metadata"]["name"] == created["metadata"]["name"] for o in here):
                return _status(409, "AlreadyExists", f'{kind} "{created["metadata"]["name"]}" already exists')
            self.created.append((_KINDS[kind], json.loads(json.dumps(_body(body)))))
            store.append(created)
            if kind == "pods" and self.kubelet is not None:
                self._run(created)
            return _Response(201, json.dumps(created))
        if method == "PATCH" and found:
            patch = _body(body)
            target = found[0]
            for section in ("labels", "annotations"):
                target["metadata"].setdefault(section, {}).update((patch.get("metadata") or {}).get(section) or {})
            return _Response(200, json.dumps(target))
        if method == "DELETE" and name is None:  # deletecollection: the deleted objects, as the API server answers
            selected = [o for o in here if _matches(o["metadata"].get("labels") or {}, query.get("labelSelector", ""))]
            for gone in selected:
                store.remove(gone)
            return _Response(200, json.dumps({"apiVersion": "v1", "kind": f"{_KINDS[kind]}List", "metadata": {},
                                              "items": selected}))
        if method == "DELETE" and name:
            if not found:
                return _status(404, "NotFound", f'{kind} "{name}" not found')
            store.remove(found[0])
            return _Response(200, json.dumps(found[0]))
        return _status(404, "NotFound", f"no route {method} {path}")


def run_pod_here(pod: dict) -> tuple[int, str]:
    """A kubelet that runs the pod's first container's `python -m ...` command on this host, with this interpreter
    (the node probe's pod: `python -m sat_tasks.io.node_probe NODE`)."""
    import subprocess
    import sys

    command = pod["spec"]["containers"][0]["command"]
    done = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=300, check=False)
    return done.returncode, done.stdout + done.stderr
