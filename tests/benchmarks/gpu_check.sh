#!/usr/bin/env bash
# The checkpoint engine's device check, for a session that is lent a GPU machine: one
# `run` call of about 5 minutes, with the machine's own python3 (PyTorch, transformers,
# safetensors, xxhash and pytest are there; nothing is installed):
#
#   run(command="bash tests/benchmarks/gpu_check.sh", timeout_s=540)
#
# Steps, each with its own timeout, each log under $OUT (they come back):
#   1. versions.txt  the GPU, torch and CUDA as python3 sees them
#   2. gpu_test.txt  the `gpu`-marked CUDA test (side stream, pinned pool, bytes back)
#   3. seed.txt      the seed script on the GPU: 20 steps with concurrent checkpoints, then
#                    a resume with CKPT_LAST_STEP=-1 to step 30 (the HF path on CUDA)
#   4. bench.txt     tests/benchmarks/ckpt_overhead_gpu.py (H200 target blocking_ratio <= 0.02)
# summary.txt has one line per step. `--cpu` runs the same steps on the CPU with tiny
# sizes (the test suite does, so the script is known to work before a GPU is lent).
set -uo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-/tmp/gpu-check}"
WORK="$(mktemp -d /tmp/gpu-check-work.XXXXXX)"
trap 'rm -rf "${WORK}"' EXIT
mkdir -p "${OUT}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
device=cuda
bench_args=()
if [ "${1:-}" = "--cpu" ]; then
  device=cpu
  bench_args=(--width 64 --layers 2 --batch 16 --steps 6 --every 3 --parser-threads 2)
  export CUDA_VISIBLE_DEVICES=""
fi
status=0
step() {  # step NAME TIMEOUT COMMAND...: run, log to $OUT/NAME.txt, note the result in summary.txt
  local name=$1 limit=$2
  shift 2
  timeout "${limit}" "$@" >"${OUT}/${name}.txt" 2>&1
  local rc=$?
  echo "${name}: exit ${rc}" | tee -a "${OUT}/summary.txt"
  [ "${rc}" = 0 ] || status=1
}
: >"${OUT}/summary.txt"

step versions 60 "${PYTHON}" -c "
import torch
name = torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device'
print('device', name, '| torch', torch.__version__, '| cuda', torch.version.cuda)
assert torch.cuda.is_available() or '${device}' == 'cpu'
"
step gpu_test 180 env PYTHONPATH=. "${PYTHON}" -m pytest -q -p no:cacheprovider -m gpu \
  tests/ckpt_engine/test_ckpt_engine.py

"${PYTHON}" -c "from ckpt_engine.vendor import write_vendor_dir; write_vendor_dir('${WORK}/vendor')"
export PYTHON WORK
SEED='
run() { env PYTHONPATH="${WORK}/vendor" "${PYTHON}" include/scripts/seed_train.py --data_dir include/corpus \
          --output_dir "${WORK}/seed" --save_steps 5 "$@"; }
run --max_steps 20 || exit 1
CKPT_LAST_STEP=-1 run --max_steps 30 2>&1 | tee "${WORK}/resume.txt" || exit 1
grep -q "Resuming from checkpoint-20" "${WORK}/resume.txt" || { echo "did not resume from checkpoint-20"; exit 1; }
PYTHONPATH=. "${PYTHON}" -m ckpt_engine.cli ckpt verify "${WORK}/seed/concurrent_checkpoint"
'
step seed 240 bash -c "set -o pipefail; ${SEED}"
step bench 300 env PYTHONPATH=. "${PYTHON}" tests/benchmarks/ckpt_overhead_gpu.py --device "${device}" \
  --dir "${WORK}/bench" ${bench_args[@]+"${bench_args[@]}"}
tail -n 1 "${OUT}/bench.txt" | tee -a "${OUT}/summary.txt"
exit "${status}"
