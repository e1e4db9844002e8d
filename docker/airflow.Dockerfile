# syntax=docker/dockerfile:1.7
# SAT Airflow image: the official Airflow image with the project's DAGs, plugins and
# packages, for the official Airflow Helm chart (docker/helm-values.yaml). Build from the
# repository root:
#
#   docker build -f docker/airflow.Dockerfile -t registry.example.com/sat/airflow:0.1.0 .
#
# Airflow itself stays the base image's 3.3.2; everything else is installed from
# requirements-airflow.lock: requirements.lock's pins for the base and the [airflow] extra
# only. Training never runs here (the kubernetes backend runs it in pods from the training
# image), and no sat_tasks module imports torch, transformers or deepspeed at import time
# (tests/test_docker.py checks it), so none of them is in this image: no deepspeed sdist to
# build, no CUDA wheels in every scheduler, API server and task pod.
FROM apache/airflow:3.3.2-python3.11

USER airflow
COPY --chown=airflow:0 requirements-airflow.lock requirements.lock pyproject.toml /opt/sat/src/
COPY --chown=airflow:0 sat_tasks /opt/sat/src/sat_tasks
COPY --chown=airflow:0 ckpt_engine /opt/sat/src/ckpt_engine

# The lock first, every package checked against its hashes (it pins apache-airflow to the
# base image's 3.3.2, so pip never swaps Airflow), then the project itself without
# touching a dependency.
RUN pip install --no-cache-dir --require-hashes -r /opt/sat/src/requirements-airflow.lock \
 && pip install --no-cache-dir --no-deps /opt/sat/src

COPY --chown=airflow:0 dags /opt/airflow/dags
COPY --chown=airflow:0 plugins /opt/airflow/plugins
COPY --chown=airflow:0 include /opt/airflow/include
COPY --chown=airflow:0 airflow.cfg /opt/airflow/airflow.cfg

# The project's airflow.cfg (with its [sat] section) is the default config; under the Helm
# chart, the chart mounts its own airflow.cfg over it (docker/helm-values.yaml carries the
# [sat] section there). Its folder paths are relative to a checkout, so pin them here;
# AIRFLOW__* env vars win over either file.
ENV AIRFLOW__CORE__DAGS_FOLDER=/opt/airflow/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/airflow/plugins \
    AIRFLOW__CORE__LOAD_EXAMPLES=False \
    AIRFLOW__SAT__JOBS_DIR=/opt/airflow/include/jobs \
    AIRFLOW__SAT__WORKSPACES_DIR=/opt/airflow/include/workspaces \
    AIRFLOW__SAT__WORK_DIR=/opt/airflow/sat-work \
    AIRFLOW__SAT__BACKEND=kubernetes \
    SAT_INCLUDE_DIR=/opt/airflow/include
