# syntax=docker/dockerfile:1.7
# SAT training image: CUDA, PyTorch and the seed's library pins, with the concurrent
# checkpoint engine vendored at $CHECKPOINT_VENDOR (scripts import it, or its `datastates`
# alias, through PYTHONPATH alone). Build from the repository root:
#
#   docker build -f docker/training.Dockerfile -t registry.example.com/sat/training:0.1.0 .
#
# The pins below are the ones in requirements.lock (tests/test_docker.py checks that they
# agree); every other package is held to the lock by `--constraint requirements.lock`.
# A devel base carries nvcc, which DeepSpeed needs to JIT-compile its fused ops; CUDA 12.9
# covers both server types (g2: H100, sm_90; g3: B300, Blackwell).
ARG BASE_IMAGE=nvidia/cuda:12.9.1-cudnn-devel-ubuntu24.04
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.9.5

FROM ${UV_IMAGE} AS uv

FROM ${BASE_IMAGE}
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu129
ARG PYTHON_VERSION=3.11

ENV DEBIAN_FRONTEND=noninteractive \
    UV_PYTHON_INSTALL_DIR=/opt/sat/python \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    VIRTUAL_ENV=/opt/sat/venv \
    PATH=/opt/sat/venv/bin:${PATH} \
    DS_BUILD_OPS=0

# bash runs the pod's supervisor (`bash -lc`); getent (libc-bin) resolves rank 0 before rendezvous.
RUN apt-get update \
 && apt-get install -y --no-install-recommends bash ca-certificates libc-bin git \
 && rm -rf /var/lib/apt/lists/*

COPY --from=uv /uv /usr/local/bin/uv
COPY requirements.lock /opt/sat/requirements.lock

# Python 3.11 (the lock's interpreter) in a venv; torch first (CUDA wheel), then the rest:
# DeepSpeed ships an sdist whose setup imports torch, hence no build isolation for it.
RUN uv venv --python ${PYTHON_VERSION} ${VIRTUAL_ENV} \
 && uv pip install --no-cache --constraint /opt/sat/requirements.lock \
        --index-url ${TORCH_INDEX_URL} --extra-index-url https://pypi.org/simple \
        torch==2.13.0 \
 && uv pip install --no-cache --constraint /opt/sat/requirements.lock \
        --no-build-isolation-package deepspeed \
        transformers==5.24.0 \
        deepspeed==0.19.8 \
        accelerate==1.15.0 \
        datasets==5.2.0 \
        safetensors==0.8.0 \
        tokenizers==0.23.3 \
        huggingface_hub==2.4.0 \
        numpy==2.4.6 \
        xxhash==4.1.0 \
        isal==1.9.1 \
        boto3==1.44.8

# The engine, laid out as a vendor directory by its own code (ckpt_engine.vendor), then
# imported from a neutral directory with PYTHONPATH set to the vendor dir alone.
COPY ckpt_engine /tmp/sat-build/ckpt_engine
RUN cd /tmp/sat-build \
 && python -c "from ckpt_engine.vendor import write_vendor_dir; write_vendor_dir('/opt/sat/checkpoint_vendor')" \
 && cd / && rm -rf /tmp/sat-build \
 && PYTHONPATH=/opt/sat/checkpoint_vendor python -c "from datastates.llm import DecoratedCheckpointing; import ckpt_engine, ckpt_engine.launch"

ENV CHECKPOINT_VENDOR=/opt/sat/checkpoint_vendor \
    PYTHONPATH=/opt/sat/checkpoint_vendor \
    PYTHONUNBUFFERED=1 \
    HF_DATASETS_OFFLINE=1

# The pod mounts staged code, data and outputs here (sat_tasks.core.runtime_env POD_*_DIR) and
# runs the job's command through `bash -lc` (sat_tasks.backends.kubernetes.supervisor); no ENTRYPOINT on purpose.
RUN mkdir -p /opt/sat/code /opt/sat/data /opt/sat/output
WORKDIR /opt/sat/code
CMD ["bash"]
