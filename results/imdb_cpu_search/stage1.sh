#!/usr/bin/env bash
# Stage 1 of the CPU search (DESIGN.md): 11 settings x seeds 0,1 x 30 iterations, PPO only, in two queues of one
# core each. Run from the repository root at the search's commit:  bash results/imdb_cpu_search/stage1.sh
set -u
OUT=results/imdb_cpu_search
BASE=(--set learning_rate=3e-5 --set batch_size=32 --set mini_batch_size=8 --set eval_every=10 --set save_every=1000)
run() {  # folder, extra flags...
  local folder=$1; shift
  python -m cory.lab.experiments --task imdb --preset cpu --methods ppo --seeds 0,1 --steps 30 \
      --out "$OUT/$folder" "${BASE[@]}" "$@"
}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
(
  run base
  run lr5e-5 --set learning_rate=5e-5
  run vader-gain --set reward_model=vader-gain
  run b16 --set batch_size=16
  run epochs2 --set ppo_epochs=2
  run horizon1250 --set horizon=1250
  run preset_b8 --set batch_size=8 --set learning_rate=1e-4
) > "$OUT/.queue_a.log" 2>&1 &
(
  run vader-scaled --set reward_model=vader-scaled
  run lr1e-4 --set learning_rate=1e-4
  run lr1e-5 --set learning_rate=1e-5
  run b64_mb16 --set batch_size=64 --set mini_batch_size=16
) > "$OUT/.queue_b.log" 2>&1 &
wait
