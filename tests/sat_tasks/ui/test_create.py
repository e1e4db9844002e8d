"""The "Create Training Job" form: the spec model's rules, each problem on its field, the registry login kept apart."""

from __future__ import annotations

import pytest

from sat_tasks.ui.create import FIELDS, SECTIONS, validate_form
from tests.support.paths import REPO

GOOD = {"name": "my-job", "learning_type": "on-demand", "framework": "pytorch", "nodes": "1",
        "resources.server_type": "cpu", "resources.gpus_per_node": "0",
        "data.source": "s3://sat-demo/datasets/tiny-corpus/", "results.destination": "s3://sat-demo/results/",
        "job_failover": "on", "image.url": "registry.example.com/team/train:1.0", "command": "python train.py"}


def test_every_section_of_the_service_has_fields_and_every_field_a_known_section():
    assert SECTIONS[:5] == ("Required information", "Service information", "Image", "Command and volume", "Tags")
    assert {f.section for f in FIELDS} == set(SECTIONS)
    assert {"registry_user", "registry_password", "storage.file_storage_mount", "tags"} <= {f.name for f in FIELDS}


def test_a_good_form_becomes_a_job_with_its_tags_and_without_a_registry_login():
    result = validate_form({**GOOD, "tags": "team=ml\n\nproject = tiny "})
    assert result.errors == {} and result.job is not None and result.registry is None
    assert result.job.tags == {"team": "ml", "project": "tiny"} and result.job.job_failover is True
    assert result.job.image.registry_conn_id is None
    unchecked = validate_form({k: v for k, v in GOOD.items() if k != "job_failover"})
    assert unchecked.job.job_failover is False  # an unticked box is False, not the default


@pytest.mark.parametrize(("changes", "field", "line"), [
    ({"name": "ab"}, "name", "name: must be 3-63 chars"),
    ({"name": "Bad_Name"}, "name", "name: must be 3-63 chars"),
    ({"nodes": "0"}, "nodes", "nodes: must be between 1 and 64"),
    ({"nodes": "two"}, "nodes", "nodes: must be a whole number, not 'two'"),
    ({"resources.gpus_per_node": "2"}, "resources.gpus_per_node",
     "resources.gpus_per_node: server type cpu has 0 GPUs per node"),
    ({"data.source": "http://x/y"}, "data.source", "data.source: must be an Object Storage URI"),
    ({"image.url": ""}, "image.url", "image.url: required field is missing"),
    ({"image.url": "user:pw@registry.example.com/x:1"}, "image.url", "image.url: must not carry credentials"),
    ({"command": "ls"}, "command", "command: must be 3-1024 chars"),
    ({"tags": "a b=c"}, "tags", "tags: key 'a b' must be 1-128 chars"),
    ({"tags": "nothing"}, "tags", "tags: line 1 ('nothing') must be key=value"),
    ({"advanced": "{not json"}, "advanced", "advanced: must be a JSON object"),
    ({"advanced": "[1]"}, "advanced", "advanced: must be a JSON object ({...}), not a list"),
    ({"advanced": '{"faults": [{"kind": "hardware"}]}'}, "advanced", "faults.0: set exactly one of at_step"),
    ({"registry_password": "pw"}, "registry_user", "registry_user: required with the registry password"),
])
def test_each_problem_is_shown_on_its_field_as_field_rule(changes, field, line):
    result = validate_form({**GOOD, **changes})
    assert result.job is None
    assert any(error.startswith(line) for error in result.errors.get(field, [])), result.errors


def test_the_registry_login_becomes_a_connection_id_and_never_a_value_of_the_form():
    result = validate_form({**GOOD, "registry_user": "robot", "registry_password": "s3cr3t", "image.insecure": "on"})
    assert result.job.image.registry_conn_id == "sat_registry_my-job" and result.job.image.insecure
    login = result.registry
    assert (login.conn_id, login.host, login.login, login.password) == (
        "sat_registry_my-job", "registry.example.com", "robot", "s3cr3t")
    assert "s3cr3t" not in repr(login) and "registry_password" not in result.values
    assert "s3cr3t" not in str(result.job.to_dict())
    failed = validate_form({**GOOD, "name": "ab", "registry_user": "robot", "registry_password": "s3cr3t"})
    assert "registry_password" not in failed.values  # the page never fills the password back in


def test_object_storage_is_asked_only_once_the_model_is_satisfied():
    asked: list[str] = []

    def exists(uri: str) -> bool:
        asked.append(uri)
        return uri.endswith("tiny-corpus/")

    result = validate_form({**GOOD, "storage.script_url": "s3://sat-demo/scripts/missing.py"}, exists=exists)
    assert result.job is None and result.errors == {
        "storage.script_url": ["storage.script_url: s3://sat-demo/scripts/missing.py is not in Object Storage"]}
    assert validate_form({**GOOD, "name": "ab"}, exists=exists).errors.keys() == {"name"}
    assert len(asked) == 2  # not for the form the model refused

    def unreachable(uri: str) -> bool:
        raise ConnectionError("down")

    down = validate_form(GOOD, exists=unreachable)
    assert down.errors == {"data.source": ["data.source: could not be checked: Object Storage answered "
                                           "ConnectionError"]}


def test_the_create_page_shows_sections_values_and_errors_next_to_their_fields():
    from sat_tasks.ui.pages import create_page

    fresh = create_page()
    for section in SECTIONS:
        assert f"<legend>{section}</legend>" in fresh
    assert "type='password'" in fresh and "3-63 chars" in fresh  # help text from the model's schema
    result = validate_form({**GOOD, "name": "ab", "registry_user": "robot", "registry_password": "s3cr3t"})
    page = create_page(result.values, result.errors)
    assert "1 problem(s): nothing was started" in page
    name_input = page.index("id='name'")
    error = page.index("<div class='error' id='error-name'>name: must be 3-63 chars")
    assert 0 < error - name_input < 400  # right under its input
    assert "s3cr3t" not in page and "value='ab'" in page and "value='robot'" in page


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in sorted(REPO.glob("include/jobs/*.yaml"))])
def test_clone_fills_the_form_so_that_it_gives_back_the_same_job(path):
    from sat_tasks.spec import load_spec
    from sat_tasks.ui.create import form_values

    job = load_spec(path)
    values = form_values(job)
    assert "registry_password" not in values  # never filled in
    result = validate_form(values)
    assert result.errors == {} and result.job == job


def test_spot_with_job_failover_is_a_problem_of_the_box_not_silently_off():
    result = validate_form({**GOOD, "learning_type": "spot"})
    assert result.job is None and result.errors == {
        "job_failover": ["job_failover: not allowed with learning_type spot (Spot jobs resume instead)"]}
    spot = validate_form({**{k: v for k, v in GOOD.items() if k != "job_failover"}, "learning_type": "spot"})
    assert spot.errors == {} and spot.job.is_spot and spot.job.job_failover is False


def test_notifications_from_the_form_and_back():
    from sat_tasks.ui.create import form_values

    result = validate_form({**GOOD, "notify_webhook": "team_hook", "notify_email": "a@example.com; b@example.com",
                            "notify_on": "completed"})
    assert [(n.webhook, n.email, [o.value for o in n.on]) for n in result.job.notifications] == [
        ("team_hook", None, ["completed"]), (None, ["a@example.com", "b@example.com"], ["completed"])]
    values = form_values(result.job)
    assert (values["notify_webhook"], values["notify_email"], values["notify_on"], values["advanced"]) == (
        "team_hook", "a@example.com, b@example.com", "completed", "")
    finer = validate_form({**GOOD, "advanced": '{"notifications": [{"webhook": "h", "endpoint": "/x"}]}'})
    assert "notify_webhook" not in form_values(finer.job)  # the form cannot say an endpoint: it stays in Advanced
    assert '"endpoint": "/x"' in form_values(finer.job)["advanced"]


# ---- elastic failover on the form (issue 32, ADR 0029) ----------------------------------------------------------
ELASTIC = {**GOOD, "nodes": "2", "elastic.min_nodes": "1", "elastic.wait_seconds": "30"}


def test_elastic_from_the_form_and_none_while_both_inputs_are_empty():
    result = validate_form(ELASTIC)
    assert result.errors == {} and (result.job.elastic.min_nodes, result.job.elastic.wait_seconds) == (1, 30.0)
    assert validate_form({**ELASTIC, "elastic.wait_seconds": ""}).job.elastic.wait_seconds == 0  # the model's default
    assert validate_form({**ELASTIC, "elastic.wait_seconds": "2.5"}).job.elastic.wait_seconds == 2.5
    plain = validate_form({**ELASTIC, "elastic.min_nodes": " ", "elastic.wait_seconds": ""})
    assert plain.errors == {} and plain.job.elastic is None


@pytest.mark.parametrize(("changes", "field", "line"), [
    pytest.param({"elastic.min_nodes": "2"}, "elastic.min_nodes", "elastic.min_nodes: must be less than nodes (2), got 2",
                 id="min-not-below-nodes"),
    pytest.param({"elastic.min_nodes": "0"}, "elastic.min_nodes", "elastic.min_nodes: must be >= 1", id="min-zero"),
    pytest.param({"elastic.min_nodes": "one"}, "elastic.min_nodes",
                 "elastic.min_nodes: must be a whole number, not 'one'", id="min-not-a-number"),
    pytest.param({"elastic.min_nodes": ""}, "elastic.min_nodes", "elastic.min_nodes: required field is missing",
                 id="wait-without-min"),
    pytest.param({"elastic.wait_seconds": "-1"}, "elastic.wait_seconds",
                 "elastic.wait_seconds: must be between 0 and 86400", id="wait-negative"),
    pytest.param({"elastic.wait_seconds": "soon"}, "elastic.wait_seconds",
                 "elastic.wait_seconds: must be a number, not 'soon'", id="wait-not-a-number"),
    pytest.param({"job_failover": ""}, "elastic.min_nodes", "elastic: only with job_failover: true",
                 id="without-failover"),
    pytest.param({"job_failover": "", "learning_type": "spot"}, "elastic.min_nodes",
                 "elastic: only with job_failover: true", id="spot"),
])
def test_a_refused_elastic_field_names_the_rule_under_its_input(changes, field, line):
    result = validate_form({**ELASTIC, **changes})
    assert result.job is None
    assert any(error.startswith(line) for error in result.errors.get(field, [])), result.errors


def test_clone_keeps_elastic_in_its_own_inputs_and_the_run_gets_it():
    from sat_tasks.airflow.params import params_from_spec, spec_from_params
    from sat_tasks.spec import parse_spec
    from sat_tasks.ui.create import form_values

    job = validate_form({**ELASTIC, "elastic.wait_seconds": "2.5"}).job
    values = form_values(job)
    assert (values["elastic.min_nodes"], values["elastic.wait_seconds"], values["advanced"]) == ("1", "2.5", "")
    assert validate_form(values).job == job
    assert parse_spec(spec_from_params(params_from_spec(job))).elastic == job.elastic  # the generic DAG's conf
    plain = form_values(validate_form(GOOD).job)
    assert (plain["elastic.min_nodes"], plain["elastic.wait_seconds"]) == ("", "")


def test_the_page_has_the_elastic_inputs_with_the_models_help_disabled_without_failover():
    from sat_tasks.ui.pages import create_page

    fresh = create_page()
    assert "id='elastic.min_nodes'" in fresh and "id='elastic.wait_seconds'" in fresh
    assert "input.disabled=!box.checked" in fresh  # the script: no failover (Spot unticks it), no elastic
    result = validate_form({**ELASTIC, "job_failover": ""})
    page = create_page(result.values, result.errors)
    field, error = page.index("id='elastic.min_nodes'"), page.index("<div class='error' id='error-elastic.min_nodes'>")
    assert 0 < error - field < 400 and "elastic: only with job_failover: true" in page[error:error + 200]
