"""SAT's test harness for users' Training Jobs: a pytest plugin (`plugin`) and what it drives.

`session` holds one test session's private Airflow home, metadata DB and embedded Object
Storage; `runs` turns a spec into a short local run (or a rehearsal) and reads back what it
left (`FinishedRun`); `checks` holds the DAG integrity, smoke and rehearsal checks, whose
failures name the job, the step and what SAT saw. ADR 0016 records the decisions.

Nothing here is imported by the rest of SAT: `sat test` loads the plugin by name.
"""
