#!/usr/bin/env bash
# The CUDA path's checks and figures on one GPU (docs/benchmarks.md, "GPU"), in one call:
#   1. the CUDA tests (flash attention in bf16, bf16 against fp32, the KV cache on the GPU);
#   2. model=base's training throughput on Shakespeare against the plain GPT, sdpa and the loop;
#   3. nanoGPT's shakespeare-char budget (model=base, 64 windows of 256, 5,000 steps), microgpt's
#      default recipe (Muon, weight averaging, bf16), trained, then sampled;
#   4. the same run compiled (train.compile=true, 2,000 steps), and the compiled throughput.
# Every stage has its own time limit; each one's output and exit status go to OUT/gpu.log.
# Needs data/shakespeare.txt (python data/prepare.py shakespeare). Usage: bash bench/gpu.sh OUT
set -u
out=${1:?usage: bash bench/gpu.sh OUT_FOLDER}
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
runs=$(mktemp -d)
stage() {  # stage LIMIT_S COMMAND...: runs it, says how long it took and how it ended
    local limit=$1 t0=$SECONDS
    shift
    echo "== $* (limit ${limit} s)"
    timeout "$limit" "$@"
    echo "== exit $? after $((SECONDS - t0)) s"
}
keep() {  # keep RUN: its metrics and log beside the figures
    cp "$runs/$1/metrics.jsonl" "$out/$1-metrics.jsonl" && cp "$runs/$1/train.log" "$out/$1-train.log"
}
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    $py -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
    stage 150 $py -m pytest -q -p no:cacheprovider tests/test_cuda.py \
        tests/heads/test_heads.py::test_importance_moves_the_rows_to_the_models_device
    common=(--device cuda --presets base --batches 64 --row-override data=shakespeare
        --rounds 3 --block-s 0.5)
    stage 150 $py bench/run.py --only throughput "${common[@]}" --impls sdpa,loop \
        --out "$out/throughput.json"
    recipe=(data=shakespeare model=base train.batch_size=64 train.eval_every=250 device=cuda)
    stage 200 $py train.py "${recipe[@]}" train.max_steps=5000 out_dir="$runs/eager"
    stage 60 $py sample.py run="$runs/eager" device=cuda num_samples=2
    keep eager
    stage 240 $py train.py "${recipe[@]}" train.max_steps=2000 train.compile=true \
        out_dir="$runs/compiled"
    keep compiled
    stage 200 $py bench/run.py --only throughput "${common[@]}" --impls sdpa --compile \
        --out "$out/throughput-compiled.json"
} 2>&1 | tee "$out/gpu.log"
