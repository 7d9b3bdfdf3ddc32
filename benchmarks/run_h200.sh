#!/bin/bash
# Every H200 benchmark of docs/benchmarks/, as one scripted device call, results in one tarball.
#
#   bash benchmarks/run_h200.sh OUT SECTION...     SECTION: tests train_rm train_dpo clip_forward serve profile
#                                                  clip_forward_towers serve_graphs serve_decode
#                                                  serve_pipeline serve_http train_dpo_gc train_dpo_lora integrations
#                                                  serve_text serve_text_profile serve_text_host eval_throughput judge_engine math
#                                                  qualify_fp16 qualify_bf16 qualify_fp32 qualify_mps_bf16
#
# Run from the repository root on the GPU machine, with the carried wheels installed
# (python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl) and
# PYTHONPATH=/tmp/site:src. Each section writes OUT/<section>/ and a line with its exit code and
# wall time to OUT/times.log; OUT/results.tar.gz holds everything. The device returns only a few
# files from $OUT, so give OUT outside it and copy the two back, e.g.
#   bash benchmarks/run_h200.sh /tmp/rk tests train_rm; cp /tmp/rk/results.tar.gz /tmp/rk/times.log $OUT/
# Each step has its own time limit so one hang cannot eat the call; a failed step does not
# stop the next one.
set -u
OUT=$1; shift
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
step() {  # step NAME LIMIT_S COMMAND...
    local name=$1 limit=$2; shift 2
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "$name rc=$? t=$(( $(date +%s) - T0 ))s" >> "$OUT/times.log"
}
# ViT-H/14 bf16, CUDA graphs, multipart, 8 items per request, 4 s cells: the HTTP-path experiments
VIT_H_B8_GRAPHS=(python3 benchmarks/serve.py --shapes clip-vit-h-14 --dtypes bf16 --transport multipart
                 --cuda-graphs --batches 8 --cell-seconds 4)
for section in "$@"; do
    mkdir -p "$OUT/$section"
    case $section in
    tests)
        step tests 300 python3 -m pytest -v -p no:cacheprovider -m gpu tests ;;  # -v: the last test named before a crash
    train_rm)
        step train_rm-8x4-trl 170 python3 benchmarks/train_rm.py --out "$OUT/train_rm/8x4_trl.json"
        step train_rm-32x1-compile 200 python3 benchmarks/train_rm.py --grad-accum 1 --skip-trl --compile \
            --out "$OUT/train_rm/32x1_compile.json" ;;
    train_dpo)  # without gradient checkpointing; train_dpo_gc has it on for both trainers
        step train_dpo 220 python3 benchmarks/train_dpo.py --out "$OUT/train_dpo/no_gc.json" ;;
    serve)
        step serve-json 300 python3 benchmarks/serve.py --shapes clip-vit-h-14 --dtypes bf16 --modes http,inproc \
            --out "$OUT/serve/vit_h_bf16_json.json"
        step serve-multipart 300 python3 benchmarks/serve.py --shapes clip-vit-h-14 --dtypes bf16 --modes http \
            --transport multipart --out "$OUT/serve/vit_h_bf16_multipart.json" ;;
    clip_forward)
        step clip_forward 240 python3 benchmarks/clip_forward.py --shapes clip-vit-h-14 --variants eager,graphs \
            --out "$OUT/clip_forward/vit_h_bf16.json" ;;
    clip_forward_towers)  # GPU time per item of each qualify tower (eager, the plans' batches): the consolidated ceiling
        step clip_forward-towers 200 python3 benchmarks/clip_forward.py --shapes clip-vit-l-14,clip-vit-h-14 \
            --variants eager --batches 16,32,64 --out "$OUT/clip_forward/towers_bf16.json" ;;
    serve_graphs)
        step serve-graphs 200 python3 benchmarks/serve.py --shapes clip-vit-h-14 --dtypes bf16 --modes http,inproc \
            --transport multipart --cuda-graphs --out "$OUT/serve/vit_h_bf16_multipart_graphs.json" ;;
    serve_decode)  # where images are decoded: in the batch (no prefetch) or by Pillow on arrival
        step serve-noprefetch 200 python3 benchmarks/serve.py --shapes clip-vit-h-14 --dtypes bf16 --modes http,inproc \
            --transport multipart --no-prefetch --out "$OUT/serve/vit_h_bf16_multipart_noprefetch.json"
        step serve-host 200 python3 benchmarks/serve.py --shapes clip-vit-h-14 --dtypes bf16 --modes http,inproc \
            --transport multipart --decode host --out "$OUT/serve/vit_h_bf16_multipart_host.json" ;;
    serve_pipeline)  # max_batch_size 64 or 128, 64 to 256 items in flight: does a half-size batch pipeline round trips?
        for mb in 64 128; do
            step "serve-mb$mb" 200 "${VIT_H_B8_GRAPHS[@]}" --modes http,inproc --concurrency 8,16,32 \
                --max-batch-size $mb --out "$OUT/serve/vit_h_bf16_graphs_mb$mb.json"
        done ;;
    serve_http)  # the HTTP front: in the scorer's process (serve --config) or a gateway before one worker (--deploy)
        for backend in inproc workers; do
            modes=http; [ $backend = inproc ] && modes=http,inproc
            step "serve-$backend" 200 "${VIT_H_B8_GRAPHS[@]}" --modes $modes --concurrency 16,32 \
                --server-backend $backend --out "$OUT/serve/vit_h_bf16_graphs_$backend.json"
        done
        step serve-switch 150 "${VIT_H_B8_GRAPHS[@]}" --modes http --concurrency 16,32 \
            --switch-interval-ms 0.5 --out "$OUT/serve/vit_h_bf16_graphs_switch05.json" ;;
    train_dpo_lora)  # LoRA r=16, checkpointing on: a pinned snapshot reference (precompute frees it) at 1, 4
                     # and 8 micro-batches per step, then the base itself as reference against TRL + peft
        for accum in 1 4 8; do
            step "train_dpo-lora-snapshot-ga$accum" 200 python3 benchmarks/train_dpo.py --gradient-checkpointing \
                --lora 16 --reference snapshot --grad-accum $accum --modes rewardplane_live,rewardplane_precomputed \
                --out "$OUT/train_dpo/lora_snapshot_ga$accum.json"
        done
        step train_dpo-lora-base 260 python3 benchmarks/train_dpo.py --gradient-checkpointing --lora 16 \
            --out "$OUT/train_dpo/lora_base.json" ;;
    train_dpo_gc)
        step train_dpo-gc 220 python3 benchmarks/train_dpo.py --gradient-checkpointing \
            --out "$OUT/train_dpo/gc.json" ;;
    profile)  # torch.profiler windows inside dedicated and consolidated workers, then their summaries
        rm -rf /tmp/rk_traces
        step qualify-profile 330 python3 -m rewardplane qualify --plan benchmarks/qualify_h200_profile.yaml \
            --out "$OUT/profile/qualify"
        ls -l --time-style=full-iso /tmp/rk_traces > "$OUT/profile/traces.ls" 2>&1
        # oldest first = the plan's deployment order (traces are several MB each: summaries travel, traces stay)
        step trace-summary 120 sh -c "ls -tr /tmp/rk_traces/*.trace.json.gz | xargs python3 -m rewardplane.bench.trace \
            > $OUT/profile/traces.json" ;;
    qualify_*)  # qualify_h200_<plan>.yaml; ~270-330 s each since shapes initialise on the CPU
        plan=${section#qualify_}
        step "qualify-$plan" 450 python3 -m rewardplane qualify --plan "benchmarks/qualify_h200_$plan.yaml" \
            --out "$OUT/qualify/$plan" ;;
    integrations)  # each trainer route against /v1/score, Qwen2-0.5B-shaped RM in bf16 (issue 21)
        step integrations 280 python3 benchmarks/integrations.py --shape qwen2-0.5b --dtype bf16 \
            --seconds 6 --warmup 2 --rounds 3 --processes 4 --out "$OUT/integrations/h200_qwen2_0.5b_bf16.json" ;;
    serve_text)  # issue 22: varlen ceiling (c), the same at the served batch size (cb, cb+), HTTP --config/--deploy (d), prefix sharing (e), GPU timelines
        step serve_text 480 python3 benchmarks/serve_text.py --models qwen2-0.5b,llama-3.2-1b --variants c,cb,cb+,d,e \
            --repeats 1 --trace "$OUT/serve_text/trace" --out "$OUT/serve_text/run10.json" ;;
    serve_text_profile)  # issue 22: where a 0.5B server's GIL goes with and without prefix sharing (py-spy on PATH: its wheel in .devcarry/wheels)
        step serve_text_profile 200 python3 benchmarks/serve_text.py --models qwen2-0.5b --variants d,e \
            --serve-modes config,deploy --repeats 1 --profile "$OUT/serve_text/profile" --profile-gil --profile-idle \
            --out "$OUT/serve_text/profile.json" ;;
    serve_text_host)  # the host side alone (model forward stood in) next to the ceiling
        step serve_text_host 200 python3 benchmarks/serve_text.py --models qwen2-0.5b --variants c,h,h+ \
            --repeats 1 --out "$OUT/serve_text/host.json" ;;
    eval_throughput)  # issue 26: the shipped eval --benchmark rewardbench2 path against serve_text's ceiling
        step eval_throughput 240 python3 benchmarks/eval_throughput.py --out "$OUT/eval_throughput/h200.json" ;;
    judge_engine)  # issue 25: transformers serve (direct, 1 in flight, through /v1/score) and the in-process judge
        step judge_engine 330 python3 benchmarks/verifiers.py --only judge_engine \
            --judge-tokenizer .devcarry/smollm2-tokenizer --out "$OUT/judge_engine/h200.json" ;;
    math)  # issue 25: math-verify in-thread per core vs through /v1/score on the 16-core host (no GPU)
        step math 240 python3 benchmarks/verifiers.py --only math --math-items 16000 --out "$OUT/math/h200_host.json" ;;
    *) echo "unknown section $section" >> "$OUT/times.log" ;;
    esac
done
tar -czf /tmp/results.tar.gz -C "$OUT" --exclude=results.tar.gz . && mv /tmp/results.tar.gz "$OUT/results.tar.gz"
