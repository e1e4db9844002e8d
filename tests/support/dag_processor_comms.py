"""What a DAG processor's parsing child reaches through `SUPERVISOR_COMMS`: its manager, for Airflow Variables.

In Airflow 3 a DAG file parsed by the DAG processor has no ORM (`block_orm_access`); the Task
SDK's `Variable` sends `GetVariable`/`PutVariable`/`DeleteVariable`/`GetVariableKeys` to the
manager, which reads and writes the metadata DB's `variable` table. `MetadataDBComms` answers the
same messages from the same table with the ORM (what the manager's in-process Execution API
does), so a test can run a SAT DAG file as a processor pass would, in one process or several
sharing the DB. `python -m tests.support.dag_processor_comms DAG_FILE` is such a pass in a
process of its own: it prints one JSON line, `{"import_error": <message or null>, "dags": n}`.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from typing import Any


class MetadataDBComms:
    """A stand-in for the DAG processor's manager: Variable requests answered from the metadata DB."""

    def __init__(self) -> None:
        self.sent: list[str] = []  # the request types, in order

    def send(self, msg: Any) -> Any:
        from airflow.models.variable import Variable
        from airflow.sdk.exceptions import ErrorType
        from airflow.sdk.execution_time.comms import (
            DeleteVariable,
            ErrorResponse,
            GetVariable,
            GetVariableKeys,
            OKResponse,
            PutVariable,
            VariableKeysResult,
            VariableResult,
        )
        from airflow.utils.session import create_session
        from sqlalchemy import delete, select

        self.sent.append(type(msg).__name__)
        with create_session() as session:
            if isinstance(msg, PutVariable):
                session.execute(delete(Variable).where(Variable.key == msg.key))
                session.add(Variable(key=msg.key, val=msg.value, description=msg.description))
                return None
            if isinstance(msg, DeleteVariable):
                session.execute(delete(Variable).where(Variable.key == msg.key))
                return OKResponse(ok=True)
            if isinstance(msg, GetVariable):
                row = session.scalar(select(Variable).where(Variable.key == msg.key))
                if row is None:
                    return ErrorResponse(error=ErrorType.VARIABLE_NOT_FOUND, detail={"message": msg.key})
                return VariableResult(key=msg.key, value=row.val)
            if isinstance(msg, GetVariableKeys):
                query = select(Variable.key).order_by(Variable.key)
                if msg.prefix is not None:
                    query = query.where(Variable.key.startswith(msg.prefix, autoescape=True))
                keys = list(session.scalars(query.offset(msg.offset).limit(msg.limit)))
                return VariableKeysResult(keys=keys, total_entries=len(keys))
        raise TypeError(f"not a Variable request: {msg!r}")


def install(monkeypatch: Any = None) -> MetadataDBComms:
    """Make this process a DAG processor's parsing child, as SAT's DAG files see it; the comms it talks through."""
    from airflow.sdk.execution_time import task_runner

    from sat_tasks.airflow import parse_budget

    comms = MetadataDBComms()
    if monkeypatch is None:
        task_runner.SUPERVISOR_COMMS = comms  # type: ignore[assignment]
        parse_budget.in_dag_processor = lambda: True  # type: ignore[assignment]
    else:
        monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", comms, raising=False)
        monkeypatch.setattr(parse_budget, "in_dag_processor", lambda: True)
    return comms


def main() -> None:
    """One DAG file parsed as a processor pass; `SAT_TEST_NO_BUDGET=1`: a spent budget (every spec left out)."""
    from sat_tasks.airflow import parse_budget

    install()
    if os.environ.get("SAT_TEST_NO_BUDGET") == "1":
        parse_budget.build_seconds = lambda *_limits: 0.0  # type: ignore[assignment]
    try:
        module = runpy.run_path(sys.argv[1])
    except ImportError as exc:
        print(json.dumps({"import_error": str(exc), "dags": 0}))
        return
    from airflow.sdk import DAG

    print(json.dumps({"import_error": None, "dags": sum(isinstance(v, DAG) for v in module.values())}))


if __name__ == "__main__":
    main()
