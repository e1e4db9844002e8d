"""`sat workspace create|edit|delete|ls|show|render` and `sat validate` of a job that names a workspace."""

from __future__ import annotations

import yaml

from sat_tasks.cli import main
from sat_tasks.io.workspaces import SlotBoard, WorkspaceStore
from tests.sat_tasks.workspaces.conftest import job_spec

CREATE = ["workspace", "create", "--name", "team-a", "--nodes", "3", "--server-type", "g2", "--gpus-per-node", "8",
          "--memory", "1600Gi", "--cpu", "100", "--start", "2026-01-01", "--end", "2099-12-31"]


def test_create_ls_show_edit_delete(sat_dirs, capsys):
    assert main(CREATE) == 0
    assert "workspace team-a created: 3 node(s), contract 2026-01-01 to 2099-12-31" in capsys.readouterr().out
    assert main(["workspace", "ls"]) == 0
    assert "team-a" in capsys.readouterr().out
    assert main(["workspace", "show", "team-a"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["nodes"] == 3
    assert main(["workspace", "edit", "team-a", "--nodes", "4"]) == 0
    assert WorkspaceStore().get("team-a").nodes == 4
    assert main(["workspace", "delete", "team-a"]) == 0
    assert WorkspaceStore().list() == []


def test_create_from_a_file_with_every_problem_as_field_and_rule(sat_dirs, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("name: Team A\nnodes: 0\ncontract: {start: 2026-02-01, end: 2026-01-01}\n")
    assert main(["workspace", "create", "-f", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert [line.split(": ")[1] for line in err] == ["name", "nodes", "contract.end"]
    assert main(["workspace", "create", "-f", str(path), "--name", "team-b", "--nodes", "2", "--end", "2026-03-01"]) == 0


def test_edit_and_delete_refusals_name_the_jobs(sat_dirs, capsys):
    main(CREATE)
    board = SlotBoard("team-a")
    ticket = board.enqueue(job="train-a", run_id="run-1", attempt=1, slots=2)
    board.poll(WorkspaceStore().get("team-a"), ticket)
    board.enqueue(job="train-b", run_id="run-2", attempt=1, slots=2)
    capsys.readouterr()
    assert main(["workspace", "ls"]) == 0
    assert "2 node(s) used; queued: train-b" in capsys.readouterr().out
    assert main(["workspace", "edit", "team-a", "--nodes", "1"]) == 1
    assert "cannot shrink to 1 node(s): running jobs use 2: train-a (run-1" in capsys.readouterr().err
    assert main(["workspace", "delete", "team-a"]) == 1
    err = capsys.readouterr().err
    assert "train-a (run-1, running" in err and "train-b (run-2, queued" in err
    assert main(["workspace", "edit", "team-a", "--nodes", "0"]) == 2
    assert "nodes: must be between 1 and 64" in capsys.readouterr().err
    assert main(["workspace", "delete", "team-z"]) == 1
    assert "no workspace named 'team-z'" in capsys.readouterr().err


def test_render_prints_the_objects_to_apply(sat_dirs, capsys):
    main(CREATE)
    capsys.readouterr()
    assert main(["workspace", "render", "team-a", "--kueue", "--node", "gpu-a", "--namespace", "ml"]) == 0
    out = capsys.readouterr().out
    kinds = [m["kind"] for m in yaml.safe_load_all(out) if m]
    assert kinds == ["Node", "ResourceFlavor", "ClusterQueue", "LocalQueue"]
    assert "# Kueue queues its jobs: LocalQueue team-a in ml" in out
    assert main(["workspace", "render", "team-a", "--no-kueue"]) == 0
    out = capsys.readouterr().out
    assert "airflow pools set sat-workspace-team-a 3" in out and "kind:" not in out


def test_sat_validate_refuses_a_job_its_workspace_cannot_take(sat_dirs, tmp_path, capsys):
    main(CREATE)
    fits, too_big = tmp_path / "fits.yaml", tmp_path / "too-big.yaml"
    fits.write_text(yaml.safe_dump(job_spec()))
    too_big.write_text(yaml.safe_dump(job_spec(nodes=4)))
    capsys.readouterr()
    assert main(["validate", str(fits)]) == 0
    assert main(["validate", str(too_big)]) == 2
    assert f"{too_big}: nodes: the job asks for 4 nodes; workspace team-a has 3" in capsys.readouterr().out


def test_validate_workspace_files(tmp_path, capsys):
    from tests.support.paths import REPO

    shipped = sorted(str(p) for p in (REPO / "include" / "workspaces").glob("*.yaml"))
    assert main(["workspace", "validate", *shipped]) == 0
    bad, renamed = tmp_path / "bad.yaml", tmp_path / "other.yaml"
    bad.write_text("name: bad\nnodes: 65\ncontract: {start: 2026-01-01, end: 2026-12-31}\n")
    renamed.write_text("name: team\nnodes: 2\ncontract: {start: 2026-01-01, end: 2026-12-31}\n")
    capsys.readouterr()
    assert main(["workspace", "validate", str(bad), str(renamed)]) == 2
    assert capsys.readouterr().out.splitlines() == [
        f"{bad}: nodes: must be between 1 and 64", f"{renamed}: name: must match the file name ('other')"]


# ---- the Airflow pool sat-workspace-<name>, kept in step as the Workspaces page keeps it -------------------
POOL_CREATE = ["workspace", "create", "--name", "team-pool", "--nodes", "2", "--start", "2026-01-01",
               "--end", "2099-12-31"]


def _pool_slots(name: str) -> int | None:
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session

    with create_session() as session:
        pool = Pool.get_pool(name, session=session)
        return None if pool is None else pool.slots


def test_create_edit_delete_keep_the_airflow_pool_in_step(sat_dirs, airflow_db, capsys):
    assert main(POOL_CREATE) == 0
    assert "Airflow pool sat-workspace-team-pool: 2 slot(s)" in capsys.readouterr().out
    assert _pool_slots("sat-workspace-team-pool") == 2
    assert main(["workspace", "edit", "team-pool", "--nodes", "5"]) == 0
    assert "Airflow pool sat-workspace-team-pool: 5 slot(s)" in capsys.readouterr().out
    assert _pool_slots("sat-workspace-team-pool") == 5
    # a refused edit or delete leaves the pool as it is
    board = SlotBoard("team-pool")
    ticket = board.enqueue(job="train-a", run_id="run-1", attempt=1, slots=4)
    assert board.poll(WorkspaceStore().get("team-pool"), ticket).admitted
    assert main(["workspace", "edit", "team-pool", "--nodes", "1"]) == 1
    assert main(["workspace", "delete", "team-pool"]) == 1
    assert _pool_slots("sat-workspace-team-pool") == 5
    board.release(ticket)
    capsys.readouterr()
    assert main(["workspace", "delete", "team-pool"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == ["workspace team-pool deleted", "Airflow pool sat-workspace-team-pool deleted"]
    assert out.err == "" and _pool_slots("sat-workspace-team-pool") is None
    # a pool someone already deleted in Airflow: the file goes, nothing to say about the pool but that it is gone
    assert main(POOL_CREATE) == 0
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session

    with create_session() as session:
        Pool.delete_pool("sat-workspace-team-pool", session=session)
    assert main(["workspace", "delete", "team-pool"]) == 0 and WorkspaceStore().list() == []


def test_without_a_reachable_metadata_db_the_file_is_written_and_one_line_says_so(tmp_path):
    """`sat workspace` as a person runs it with an Airflow home that has no metadata DB: no DB file is made."""
    import os
    import subprocess
    import sys

    home = tmp_path / "airflow-home"
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__SAT__WORKSPACES_DIR": str(tmp_path / "workspaces"),
           "AIRFLOW__SAT__WORK_DIR": str(tmp_path / "work")}
    env.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", None)
    result = subprocess.run([sys.executable, "-m", "sat_tasks.cli", *POOL_CREATE], env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "workspace team-pool created: 2 node(s)" in result.stdout
    warnings = [line for line in result.stderr.splitlines() if "sat-workspace-team-pool" in line]
    assert warnings == [f"Airflow pool sat-workspace-team-pool not set: the Airflow metadata DB "
                        f"{home / 'airflow.db'} does not exist"], result.stderr
    assert (tmp_path / "workspaces" / "team-pool.yaml").is_file() and not (home / "airflow.db").exists()
