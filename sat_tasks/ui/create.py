"""The "Create Training Job" form: its fields in the service's words and sections, and its validation.

The form is the spec model's, seen through a person's eyes: each field fills one spec
path (`resources.server_type`) and takes its help text from the model's JSON Schema, so
the form never states a rule the model does not check. Its fields are the rows of the one
table both Create forms read (`sat_tasks.spec.form_fields`; the other is the generic DAG's). `validate_form` turns the posted
values into a `TrainingJob` with the spec model (`parse_spec`, cross-field rules
included) and, for every problem, an error `<field>: <rule>` on the form field it belongs
to; nothing starts until there is none. Object Storage checks that the model cannot do
(does the data prefix hold anything, does the script exist) are injected (`exists`).

The registry user and password never enter the spec or the run: they become an Airflow
connection (`registry_conn_id`), and the spec names only its id. No other secret enters them
either (issue 44.4, ADR 0043): the run's conf is the generic DAG's, readable in Airflow to
everyone who may read that DAG, so an `env` key that names a secret or a value that looks like
one is refused (`env_secret_problems`); a secret reaches a job by reference only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sat_tasks.io.data_roots import source_refusals
from sat_tasks.spec import SpecError, TrainingJob, parse_spec
from sat_tasks.spec.env_secrets import env_secret_problems
from sat_tasks.spec.form_fields import (
    ADVANCED,
    ADVANCED_FIELD,
    COMMAND,
    ELASTIC_MIN_NODES,
    ELASTIC_WAIT,
    IMAGE,
    NOTIFICATIONS,
    NOTIFY_EMAIL,
    NOTIFY_ENDS,
    NOTIFY_ON,
    NOTIFY_WEBHOOK,
    REGISTRY_PASSWORD,
    REGISTRY_USER,
    REQUIRED,
    SERVICE,
    TAGS,
    TAGS_FIELD,
    FormField,
    page_fields,
)
from sat_tasks.spec.form_fields import PAGE_SECTIONS as SECTIONS
from sat_tasks.spec.loading import NESTING_RULE

__all__ = [
    "ADVANCED", "ADVANCED_FIELD", "BY_NAME", "COMMAND", "ELASTIC_MIN_NODES", "ELASTIC_WAIT", "FIELDS", "FORM_ONLY",
    "IMAGE", "NOTIFICATIONS", "NOTIFY_EMAIL", "NOTIFY_ENDS", "NOTIFY_ON", "NOTIFY_WEBHOOK", "REGISTRY_PASSWORD",
    "REGISTRY_USER", "REQUIRED", "SECTIONS", "SERVICE", "TAGS", "TAGS_FIELD", "FormField", "FormResult",
    "RegistryLogin", "add_problems", "form_values", "help_text", "notifications_from_form", "notify_fields",
    "parse_tag_lines", "parse_tags", "registry_conn_id", "spec_from_form", "validate_form",
]

# The inputs the page turns into the spec itself (the registry login, tags as lines, notifications, Advanced JSON);
# every other field fills its spec path as typed.
FORM_ONLY = (REGISTRY_USER, REGISTRY_PASSWORD, TAGS_FIELD, ADVANCED_FIELD, NOTIFY_WEBHOOK, NOTIFY_EMAIL, NOTIFY_ON)
# The page's fields, in the order it shows them (one table with the generic DAG's form: sat_tasks.spec.form_fields).
FIELDS: tuple[FormField, ...] = page_fields()
BY_NAME = {f.name: f for f in FIELDS}


def _fills(form: FormField) -> str | None:
    """The spec path the page's input fills as typed; None for a form-only input."""
    return None if form.name in FORM_ONLY else form.path


Exists = Callable[[str], bool]  # does this s3:// URI (an object, or a prefix ending in /) hold anything?


@dataclass(frozen=True)
class RegistryLogin:
    """The registry user and password of a created job (to store as an Airflow connection; never logged)."""

    conn_id: str
    host: str
    login: str
    password: str = field(repr=False)
    insecure: bool = False


@dataclass
class FormResult:
    """What `validate_form` found: the job (None while there are errors) and the errors per form field."""

    values: dict[str, str]
    job: TrainingJob | None = None
    errors: dict[str, list[str]] = field(default_factory=dict)
    registry: RegistryLogin | None = None

    def add(self, form_field: str, spec_field: str, rule: str) -> None:
        self.errors.setdefault(form_field, []).append(f"{spec_field}: {rule}")

    @property
    def problems(self) -> list[dict[str, str]]:
        """Every error as `{"field", "rule"}` (the REST API's 422 body)."""
        return [{"field": line.split(": ", 1)[0], "rule": line.split(": ", 1)[1], "input": name}
                for name, lines in self.errors.items() for line in lines]


def help_text(form: FormField) -> str:
    """The field's help: its own, else the spec model's description of the path it fills."""
    return form.description


def registry_conn_id(job_name: str) -> str:
    """The Airflow connection that holds a created job's registry login."""
    return f"sat_registry_{job_name}"


def _set(spec: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        spec = spec.setdefault(part, {})
    spec[leaf] = value


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def parse_tag_lines(text: str, result: FormResult) -> dict[str, str]:
    tags: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            result.add(TAGS_FIELD, "tags", f"line {number} ({line.strip()[:40]!r}) must be key=value")
            continue
        tags[key.strip()] = value.strip()
    return tags


def spec_from_form(values: dict[str, str], result: FormResult) -> dict[str, Any]:
    """The spec mapping the posted values describe; form-level problems (numbers, tags, JSON) go to `result`."""
    spec: dict[str, Any] = {}
    for form in FIELDS:
        path = _fills(form)
        if path is None:
            continue
        raw = values.get(form.name)
        if form.kind == "checkbox":
            _set(spec, path, raw not in (None, "", "off", "false"))
            continue
        raw = (raw or "").strip()
        if not raw:
            continue  # the model's default, or its "required field is missing"
        if form.kind in ("number", "decimal"):
            try:
                _set(spec, path, int(raw) if form.kind == "number" else float(raw))
            except ValueError:
                result.add(form.name, path,
                           f"must be a {'whole ' if form.kind == 'number' else ''}number, not {raw[:20]!r}")
            continue
        _set(spec, path, raw)
    spec["tags"] = parse_tag_lines(values.get(TAGS_FIELD) or "", result)
    notifications = notifications_from_form(values)
    if notifications:
        spec["notifications"] = notifications
    # Spot with Job failover ticked is refused under the box (the model's rule), never turned off silently;
    # the form's script unticks and disables the box when Spot is picked.
    advanced = (values.get(ADVANCED_FIELD) or "").strip()
    if advanced:
        try:
            extra = json.loads(advanced)
        except ValueError as exc:
            extra = None
            result.add(ADVANCED_FIELD, "advanced", f"must be a JSON object ({exc.msg} at line {exc.lineno})")
        except RecursionError:  # nested past the parser's recursion (issue 44.7): the spec's nesting rule
            extra = None
            result.add(ADVANCED_FIELD, "advanced", NESTING_RULE)
        if extra is not None and not isinstance(extra, dict):
            result.add(ADVANCED_FIELD, "advanced", "must be a JSON object ({...}), not a " + type(extra).__name__)
        elif extra:
            _merge(spec, extra)
    return spec


def notifications_from_form(values: dict[str, str]) -> list[dict[str, Any]]:
    """The spec's `notifications` from the form's webhook, e-mail and ends (empty when neither is filled)."""
    ends = NOTIFY_ENDS.get((values.get(NOTIFY_ON) or "").strip(), NOTIFY_ENDS["every end"])
    webhook = (values.get(NOTIFY_WEBHOOK) or "").strip()
    emails = [a.strip() for a in (values.get(NOTIFY_EMAIL) or "").replace(";", ",").split(",") if a.strip()]
    return ([{"webhook": webhook, "on": ends}] if webhook else []) + ([{"email": emails, "on": ends}] if emails else [])


def notify_fields(notifications: list[Any]) -> dict[str, str] | None:
    """The form's webhook, e-mail and ends for `notifications`, when the form can say them (None: it cannot)."""
    webhooks = [n for n in notifications if n.webhook is not None]
    emails = [n for n in notifications if n.email is not None]
    ends = {tuple(on.value for on in n.on) for n in notifications}
    choice = next((name for name, on in NOTIFY_ENDS.items() if {tuple(on)} == ends), None)
    if len(webhooks) > 1 or len(emails) > 1 or (notifications and choice is None) \
            or any(n.endpoint for n in webhooks) or any(n.smtp_conn_id != "smtp_default" for n in emails):
        return None
    return {NOTIFY_WEBHOOK: webhooks[0].webhook if webhooks else "",
            NOTIFY_EMAIL: ", ".join(emails[0].email) if emails else "", NOTIFY_ON: choice or "every end"}


def _form_field_of(spec_field: str) -> str:
    """The form field a spec problem belongs to: its own input, the nearest enclosing one, else Advanced."""
    if spec_field.startswith("notifications"):  # notifications.0.webhook -> the webhook input, ...
        leaf = spec_field.split(".")[2] if spec_field.count(".") >= 2 else ""
        return {"webhook": NOTIFY_WEBHOOK, "endpoint": NOTIFY_WEBHOOK, "email": NOTIFY_EMAIL}.get(leaf, NOTIFY_ON)
    path = spec_field
    while path:
        if path in BY_NAME:
            return path
        child = next((name for name in BY_NAME if name.startswith(path + ".")), None)
        if child is not None:  # a whole section missing ("image"): its first input
            return child
        path = path.rpartition(".")[0]
    return TAGS_FIELD if spec_field.startswith("tags") else ADVANCED_FIELD


def validate_form(values: dict[str, str], exists: Exists | None = None) -> FormResult:
    """Validate the posted form with the spec model; the job when there is no problem, else every problem."""
    result = FormResult(values={k: v for k, v in values.items() if k != REGISTRY_PASSWORD})
    spec = spec_from_form(values, result)
    user, password = (values.get(REGISTRY_USER) or "").strip(), values.get(REGISTRY_PASSWORD) or ""
    if bool(user) != bool(password):
        missing = REGISTRY_PASSWORD if user else REGISTRY_USER
        result.add(missing, missing, "required with the registry " + ("user" if user else "password"))
    if user and password and spec.get("name"):
        spec.setdefault("image", {})["registry_conn_id"] = registry_conn_id(str(spec["name"]))
    try:
        job = parse_spec(spec, source="Create Training Job")
    except SpecError as exc:
        for problem in exc.problems:
            result.add(_form_field_of(problem.field), problem.field, problem.rule)
        return result
    for spec_field, rule in env_secret_problems(job.env):  # issue 44.4: no secret in the run's conf
        result.add(ADVANCED_FIELD, spec_field, rule)
    refusals = source_refusals(job)  # authorized before anything asks Object Storage (ADR 0039)
    for refusal in refusals:
        result.add(refusal.field, refusal.field, refusal.rule)
    if exists is not None and not refusals:
        _check_object_storage(job, exists, result)
    if result.errors:
        return result
    result.job = job
    if user and password:
        host = job.image.url.split("/")[0]
        result.registry = RegistryLogin(job.image.registry_conn_id or registry_conn_id(job.name), host, user,
                                        password, job.image.insecure)
    return result


def form_values(job: TrainingJob) -> dict[str, str]:
    """The form filled in from a job's spec (Clone): each field from the path it fills, tags as lines, the rest of
    the spec's non-default fields as the Advanced JSON. Never a registry login: the spec names only its connection
    (kept in Advanced, so the clone pulls with the same login until another is typed)."""
    full, changed = job.to_dict(), job.model_dump(mode="json", exclude_defaults=True)
    values: dict[str, str] = {}
    for form in FIELDS:
        path = _fills(form)
        if path is None:
            continue
        node: Any = full
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, float) and node.is_integer():
            node = int(node)  # 300.0 -> "300": the form's whole-number fields
        if form.kind == "checkbox":
            values[form.name] = "on" if node else ""
        else:
            values[form.name] = "" if node is None else str(node)
        _drop(changed, path)
    values[TAGS_FIELD] = "\n".join(f"{key}={value}" for key, value in job.tags.items())
    changed.pop("tags", None)
    _drop(changed, "results.dag_id")  # the run's own DAG, which validate_spec sets: a new run gets its own
    notify = notify_fields(job.notifications)
    if notify is not None:  # else they stay in Advanced, as the spec has them
        values.update(notify)
        changed.pop("notifications", None)
    values[ADVANCED_FIELD] = json.dumps(changed, indent=2) if changed else ""
    return values


def _drop(spec: dict[str, Any], path: str) -> None:
    """Remove `path` from a nested mapping, and the parents it leaves empty."""
    head, _, rest = path.partition(".")
    if head not in spec:
        return
    if rest and isinstance(spec[head], dict):
        _drop(spec[head], rest)
        if spec[head]:
            return
    spec.pop(head)


def add_problems(result: FormResult, problems: list[Any]) -> FormResult:
    """Checks made after the model's (the job's workspace, ...): each `{field, rule}` problem on its form field."""
    for problem in problems:
        result.add(_form_field_of(problem.field), problem.field, problem.rule)
    if problems:
        result.job = None
    return result


def _check_object_storage(job: TrainingJob, exists: Exists, result: FormResult) -> None:
    """What only Object Storage can tell: the data prefix holds objects, the script is there.

    Asked only of sources `source_refusals` allows: the answer is no oracle of other prefixes.
    """
    checks = [("data.source", job.data.source, "holds no objects in Object Storage: upload the data first")]
    if job.storage.script_url:
        checks.append(("storage.script_url", job.storage.script_url, "is not in Object Storage"))
    for path, uri, rule in checks:
        try:
            found = exists(uri)
        except Exception as exc:  # noqa: BLE001 - the form says the store could not answer; nothing is lost
            result.add(path, path, f"could not be checked: Object Storage answered {type(exc).__name__}")
            continue
        if not found:
            result.add(path, path, f"{uri} {rule}")


def parse_tags(job: TrainingJob, text: str) -> tuple[dict[str, str] | None, list[str]]:
    """Tags from `key=value` lines, checked with the spec model's tag rules: (tags, []) or (None, problems)."""
    result = FormResult(values={})
    tags = parse_tag_lines(text, result)
    problems = [line for lines in result.errors.values() for line in lines]
    if not problems:
        try:
            parse_spec({**job.to_dict(), "tags": tags}, source="tags")
        except SpecError as exc:
            problems = [str(p) for p in exc.problems if p.field.startswith("tags")]
    return (None, problems) if problems else (tags, [])
