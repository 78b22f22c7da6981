#!/usr/bin/env bash
# Every CUDA path of vitkit checked in one prepared run on a GPU machine, inside a fixed time (default 570 s):
# the test suite (CUDA tests included: tests pick CUDA where present), NCCL + FSDP2 and DDP under torchrun,
# `vitkit bench --model vit_b16` and compare.py against timm (bf16, torch.compile, one process), a row for
# benchmarks/results/gpu.jsonl, a profile of the step, CIFAR-10 training on CUDA with the GPU's utilisation
# sampled, `vitkit serve` on CUDA under load, and pre-training then fine-tuning (when the data is carried).
# Steps run in that order; one the deadline leaves no time for is skipped and says so.  Each step has its own time limit and a log;
# a step that fails or runs out of time does not stop the next.
#
#   OUT=DIR bash benchmarks/gpu_checklist.sh          # from the repository root, with CUDA torch on python3
#
# Optional, beside the repository (both git-ignored): .whl/ holds wheels of the packages the machine lacks
# (installed into /tmp/site); .gpudata/cifar.tgz the CIFAR-10 JPEG folder (`tar czf .gpudata/cifar.tgz -C
# ../shared/data cifar10-jpg`, 16 MB) and .gpudata/tiny/ two Tiny-ImageNet shards with classes.txt and
# class_names.txt (37 MB: what fits beside them in a device call's 64 MiB).  Results land in $OUT:
# summary.txt (one line per step), logs.tgz (every step's log, GPU utilisation samples, the suite's junit XML)
# and results.tgz (benchmarks/results/*.jsonl with the rows this run appended).
set -u
OUT=${OUT:-gpu-checklist}
WORK=${WORK:-/tmp/vitkit-gpu}
mkdir -p "$OUT/logs" "$WORK"
DEADLINE=$(($(date +%s) + ${DEADLINE_S:-570}))
SUMMARY="$OUT/summary.txt"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

step() {  # NAME LIMIT_S COMMAND...: run with a time limit (clipped to what is left), log, one summary line
    local name=$1 limit=$2 left
    shift 2
    left=$((DEADLINE - $(date +%s) - 15))
    ((limit > left)) && limit=$left
    if ((limit < 10)); then
        echo "$name: skipped, no time left" | tee -a "$SUMMARY"
        return
    fi
    local t0 rc
    t0=$(date +%s)
    timeout -s INT -k 20 "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
    rc=$?
    echo "$name: rc $rc in $(($(date +%s) - t0)) s (limit $limit s)" | tee -a "$SUMMARY"
}

sample_gpu() {  # NAME: GPU utilisation and memory every 0.5 s until killed
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv,noheader -lms 500 \
        >"$OUT/logs/util-$1.csv" 2>&1 &
    echo $!
}

{
    nvidia-smi
    python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"
    nproc
    if [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl && echo "installed: $(ls .whl)"
    fi
    [ -f .gpudata/cifar.tgz ] && tar xzf .gpudata/cifar.tgz -C "$WORK" && echo "CIFAR-10 in $WORK/cifar10-jpg"
} >"$OUT/logs/setup.log" 2>&1
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"

# 1. the whole suite, CUDA tests included; beside it (correctness only, no timing), torchrun with one process:
#    NCCL and FSDP2 (its sharded checkpoint and export), then DDP; the DDP run's model is served in step 4
{
    step torchrun_fsdp 60 torchrun --standalone --nproc_per_node 1 -m vitkit train --recipe small-8px-tiny \
        --epochs 3 --set run.parallel=fsdp --set optim.ema_decay=0 --out "$WORK/runs/fsdp" --json
    step torchrun_ddp 60 torchrun --standalone --nproc_per_node 1 -m vitkit train --recipe small-8px-tiny \
        --epochs 3 --set run.parallel=ddp --out "$WORK/runs/ddp" --json
} &
step suite 170 env OMP_NUM_THREADS=2 python3 -m pytest -v -n 10 --dist loadfile -p no:cacheprovider -rfE \
    --junitxml="$OUT/logs/junit.xml"
wait

# 2. ViT-B/16 at 224 px, bf16, compiled: vitkit bench (MFU against the measured bf16 matmul peak), then timm beside
#    vitkit in one process; gpu_row.py makes the row of both
step bench 100 python3 -m vitkit bench --model vit_b16 --precision bf16 --compile --device cuda --batch-size 128 \
    --warmup 3 --steps 10 --repeats 3 --json
step compare 130 python3 benchmarks/compare.py --device cuda --compile --configs b16 --precisions bf16 \
    --libraries vitkit,timm --rounds 5 --steps 10 --warmup 3 --json
step gpu_row 15 python3 benchmarks/gpu_row.py "$OUT/logs/bench.log" "$OUT/logs/compare.log"
step profile 80 python3 benchmarks/profile_step.py --model vit_b16 --batch-size 128 --precision bf16 --compile

# 3. CIFAR-10 from scratch on CUDA: a short budget, the GPU's utilisation sampled
if [ -d "$WORK/cifar10-jpg" ]; then
    sampler=$(sample_gpu train)
    step train_cifar10 90 python3 benchmarks/train_budget.py --data "folder:$WORK/cifar10-jpg" --minutes 1.0
    kill "$sampler" 2>/dev/null
fi

# 3a. the served model on CUDA under load
sampler=$(sample_gpu serve)
step serve_load 60 python3 benchmarks/serve_load.py "$WORK/runs/ddp" --data digits --seconds 4 --rounds 2 \
    --clients 16 --threads 4
kill "$sampler" 2>/dev/null

# 3b. the transfer path at GPU scale: pre-train on the carried Tiny-ImageNet shards, fine-tune on CIFAR-10
if [ -d .gpudata/tiny ] && [ -d "$WORK/cifar10-jpg" ]; then
    step transfer_pretrain 120 python3 benchmarks/transfer.py pretrain --data wds:.gpudata/tiny --minutes 1.5
    run=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])['run_dir'])" \
        "$OUT/logs/transfer_pretrain.log" 2>/dev/null)
    [ -n "$run" ] && step transfer_finetune 100 python3 benchmarks/transfer.py finetune --init "$run" \
        --data "folder:$WORK/cifar10-jpg" --minutes 1
fi

tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
tar czf "$OUT/results.tgz" benchmarks/results
cat "$SUMMARY"
