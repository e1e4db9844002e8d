# syntax=docker/dockerfile:1.7
# SAT training image: CUDA, PyTorch and the seed's library pins, with the concurrent
# checkpoint engine vendored at $CHECKPOINT_VENDOR (scripts import it, or its `datastates`
# alias, through PYTHONPATH alone). Build from the repository root:
#
#   docker build -f docker/training.Dockerfile -t registry.example.com/sat/training:0.1.0 .
#
# `make image` builds the CPU variant of the same file on this host, offline but for the
# package registries (sat_tasks/backends/local/image_build.py): a debootstrapped Debian base
# for BASE_IMAGE, the venv's uv for UV_IMAGE, PyPI for TORCH_INDEX_URL, and the machine's
# wheel folder (the lock's torch==2.13.0+cpu) mounted at FIND_LINKS.
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
# Build-time only (ARGs are not the image's ENV): a folder of wheels the indexes lack, mounted by
# the builder (`make image`: /opt/wheels, which holds the lock's CPU torch); a CA bundle to trust
# (a TLS-inspecting proxy); and whether uv may use a cache the builder mounts at /root/.cache/uv.
ARG FIND_LINKS=
ARG BUILD_CA_BUNDLE=
ARG UV_NO_CACHE=1

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
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin

COPY --from=uv /uv /usr/local/bin/uv
COPY requirements.lock /opt/sat/requirements.lock

# Python 3.11 (the lock's interpreter) in a venv; torch first (CUDA wheel), then the rest:
# DeepSpeed ships an sdist whose setup imports torch, hence no build isolation for it (and
# setuptools beside torch, in the venv it builds in).
# The constraints are the lock without its torch entry: the lock holds the CPU build
# (2.13.0+cpu), which a CUDA build of the same release would contradict; torch is pinned by its
# own requirement below. uv consults only the first index that has a package (the extra index
# before --index-url), so the torch step compares all of them (unsafe-best-match): 2.13.0+cu129
# (or +cpu from FIND_LINKS) sorts above PyPI's plain 2.13.0.
RUN if [ -n "${BUILD_CA_BUNDLE}" ]; then export SSL_CERT_FILE="${BUILD_CA_BUNDLE}"; fi \
 && awk '/^torch==/ {skip = 1; next} skip && /^[ \t]/ {next} {skip = 0; print}' \
        /opt/sat/requirements.lock > /opt/sat/constraints.txt \
 && uv venv --python ${PYTHON_VERSION} ${VIRTUAL_ENV} \
 && UV_INDEX_STRATEGY=unsafe-best-match uv pip install --constraint /opt/sat/constraints.txt \
        --index-url ${TORCH_INDEX_URL} --extra-index-url https://pypi.org/simple \
        ${FIND_LINKS:+--find-links ${FIND_LINKS}} \
        torch==2.13.0 setuptools==84.2.1 \
 && uv pip install --constraint /opt/sat/constraints.txt \
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
        boto3==1.44.8 \
 && rm -f /tmp/uv-*.lock \
 && python -c "import torch; print('torch', torch.__version__)"

# The pod's supervisor runs the job through `bash -lc`, and a login shell's /etc/profile resets
# PATH (Debian's does): put the venv back in front.
RUN printf '%s\n' '# SAT training image: the venv first, also in login shells (/etc/profile resets PATH).' \
        'case ":${PATH}:" in *:/opt/sat/venv/bin:*) ;; *) PATH="/opt/sat/venv/bin:${PATH}" ;; esac' \
        'export PATH VIRTUAL_ENV=/opt/sat/venv' > /etc/profile.d/sat.sh

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
# Training runs as uid/gid 1000, never root (issue 44.3, ADR 0040): the Kubernetes pods say so too
# (runAsNonRoot, `[sat] k8s_run_as_user`), as the local runtime's `--user 1000:1000` does. A numeric USER,
# so the kubelet can check it is not root; the directories it writes are its own, and HOME is one it owns.
RUN mkdir -p /opt/sat/code /opt/sat/data /opt/sat/output /home/sat \
 && chown 1000:1000 /opt/sat/code /opt/sat/data /opt/sat/output /home/sat
ENV HOME=/home/sat
USER 1000:1000
WORKDIR /opt/sat/code
CMD ["bash"]
