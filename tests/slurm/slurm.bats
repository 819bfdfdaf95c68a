#!/usr/bin/env bats
# The recipes and sbatch/mt-launch under a real Slurm on localhost (tests/slurm/cluster.sh: its own
# munged, slurmctld and slurmd, SLURM_CONF, state directory and free ports; one node advertising
# 32 CPUs on this machine's cores). Checks: LLaMA-3 70B's recipe in tiny mode runs to the end on 32
# CPU ranks (TP4 PP4 CP2) and prints its summary, with a verified checkpoint, valid JSONL and the
# provenance files; `scancel --signal=USR1 --batch` makes it save, exit 75, requeue itself and
# resume to the straight run's numbers; a job reaching its time limit (--time=2, warned by
# --signal=B:USR1@60) does the same; every other dense recipe's tiny mode runs (one row of each suite,
# the FSDP study's TP + FSDP row fsdp-7b-tp2-fsdp2 and the 345M study's BERT row
# bert-tp2pp2-s512-sp-selective);
# teardown leaves no daemon behind. Needs root: skipped with a message without it, a failure under
# CI=true. Slurm holds a requeued job for about 2 minutes before it may start again; the tests cut
# that short with `scontrol update StartTime=now` (a cluster would simply wait).

setup_file() {
  if [[ $(id -u) -ne 0 ]]; then
    if [[ "${CI:-}" == true ]]; then
      echo "tests/slurm needs root (it starts munged, slurmctld and slurmd) and CI=true: failing" >&2
      return 1
    fi
    export MT_SLURM_SKIP="tests/slurm needs root (it starts munged, slurmctld and slurmd); run as root or in CI"
    return 0
  fi
  export MT_ROOT="$(cd "$BATS_TEST_DIRNAME/../.." && pwd)"
  export MT_BIN="${MT_BIN:-$MT_ROOT/build/bin}"
  export LAB="$(mktemp -d /tmp/mt-slurm-XXXXXX)"
  "$MT_ROOT/tests/slurm/cluster.sh" up "$LAB/state" >&3 2>&1
}

teardown_file() {
  if [[ -n "${LAB:-}" ]]; then
    "$MT_ROOT/tests/slurm/cluster.sh" down "$LAB/state" >&3 2>&1 || true
    rm -rf "$LAB"
  fi
}

setup() {
  bats_load_library bats-support
  bats_load_library bats-assert
  [[ -z "${MT_SLURM_SKIP:-}" ]] || skip "$MT_SLURM_SKIP"
  source "$LAB/state/env.sh"
  # task/none: this cluster cannot bind CPUs; the tiny ranks share 2 cores.
  export MT_CPU_BIND=none MT_SCALE=tiny
}

# Resources that override a recipe header for tiny mode on this one node.
TINY_70B=(--nodes=1 --ntasks=32 --ntasks-per-node=32 --gpus-per-node=0 --cpus-per-task=1 --time=15)
TINY_8B=(--nodes=1 --ntasks=8 --ntasks-per-node=8 --gpus-per-node=0 --cpus-per-task=1 --time=15)

submit() { sbatch --parsable "$@"; }

# scancel JOB, asked again if slurmctld's answer timed out (the request may have been done then:
# "already completing or completed" after a timeout counts as cancelled). Only for plain cancels: a
# signal sent twice would be a second signal to mt-train.
cancel_job() {
  local tries=3 err
  until err="$(scancel "$1" 2>&1)"; do
    if [[ "$err" == *"already completing or completed"* && $tries -lt 3 ]]; then return 0; fi
    [[ "$err" == *"timed out"* && $((tries -= 1)) -gt 0 ]] || { echo "scancel $1: $err" >&2; return 1; }
    sleep 2
  done
}

job_field() { scontrol show job -o "$1" | grep -o "$2=[^ ]*" | cut -d= -f2; }

# A requeued job is held about 2 minutes; released at once, it can reach slurmd before its last
# start has ended there ("Job credential revoked"). So it is released once no slurmstepd of the
# job is left and 2 s have passed since it was requeued (credentials are compared in seconds).
release_requeued() {
  local id="$1"
  pgrep -f "^slurmstepd: \[$id\." >/dev/null && return 0
  [[ -n "${REQUEUE_SEEN[$id]:-}" ]] || { REQUEUE_SEEN[$id]=$SECONDS; return 0; }
  [[ $((SECONDS - REQUEUE_SEEN[$id])) -ge 2 ]] || return 0
  unset "REQUEUE_SEEN[$id]"
  scontrol update jobid="$id" StartTime=now >/dev/null 2>&1 || true
}
declare -gA REQUEUE_SEEN

# wait_job ID SECONDS [STATE...]: polls until the job is in one of STATEs (default: an end state).
# A requeued job held by Slurm (Reason=BeginTime) is released at once.
wait_job() {
  local id="$1" limit="$2"; shift 2
  local states="${*:-COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY}" tries=$((limit * 5)) state
  while [[ $tries -gt 0 ]]; do
    state="$(job_field "$id" JobState)"
    [[ " $states " == *" $state "* ]] && return 0
    if [[ "$state" == PENDING && "$(job_field "$id" Reason)" == BeginTime ]]; then release_requeued "$id"; fi
    sleep 0.2
    tries=$((tries - 1))
  done
  fail "job $id is $state after $limit s (waiting for $states)"
}

# wait_for_step LOG ITERATION SECONDS: until a step record of that iteration is in LOG.
wait_for_step() {
  local tries=$(($3 * 5))
  while ! grep -q "\"record\":\"step\",\"iteration\":$2," "$1" 2>/dev/null; do
    tries=$((tries - 1))
    [[ $tries -gt 0 ]] || fail "no step $2 in $1 after $3 s"
    sleep 0.2
  done
}

# Per iteration [iteration, lm_loss, grad_norm] of JSONL files, in order.
step_numbers() { cat "$@" | jq -c 'select(.record=="step") | [.iteration, .lm_loss, .grad_norm]'; }

# The outputs of a finished tiny run in $1 (MT_OUT) and its job output $2.
check_finished_run() {
  local out="$1" job_out="$2"
  jq -e -s 'map(select(.record=="verify")) | length == 1 and .[0].ok == true and .[0].failed == 0' \
    "$out/run/verify.jsonl" >/dev/null || fail "checkpoint not verified: $(cat "$out/run/verify.jsonl")"
  local file
  for file in "$out"/run/*.jsonl; do
    jq -e -s 'length > 0' "$file" >/dev/null || fail "$file is not valid JSONL"
  done
  grep -q "== mt recipe .*: summary (MT_SCALE=tiny) ==" "$job_out" || fail "no summary: $(cat "$job_out")"
  [[ -s "$out/run/provenance/restart-0/scontrol-show-job.txt" ]] || fail "no scontrol show job"
  grep -q "^SLURM_JOB_ID=" "$out/run/provenance/restart-0/environment.txt" || fail "no SLURM_ environment"
  grep -q "^MT_SCALE=tiny" "$out/run/provenance/restart-0/environment.txt" || fail "no MT_ environment"
}

@test "MT_SCALE=tiny sbatch --nodes=1 --ntasks=32 recipes/llama70b_tp4_pp4.sh runs TP4 PP4 CP2 to the end and prints its summary" {
  local out="$LAB/70b-straight"
  local id
  id="$(MT_OUT="$out" MT_TRAIN_ITERS=6 submit "${TINY_70B[@]}" -o "$LAB/70b-straight.out" "$MT_ROOT/recipes/llama70b_tp4_pp4.sh")"
  wait_job "$id" 400
  [[ "$(job_field "$id" JobState) $(job_field "$id" ExitCode)" == "COMPLETED 0:0" ]] || fail "$(cat "$LAB/70b-straight.out")"
  check_finished_run "$out" "$LAB/70b-straight.out"
  jq -e -s '.[0].world_size == 32 and .[0].parallel.tensor_model_parallel_size == 4 and .[0].parallel.pipeline_model_parallel_size == 4
    and .[0].parallel.context_parallel_size == 2 and .[0].parallel.data_parallel_size == 1' "$out/run/train.restart-0.jsonl" >/dev/null \
    || fail "layout: $(head -1 "$out/run/train.restart-0.jsonl")"
  [[ "$(step_numbers "$out/run/train.restart-0.jsonl" | wc -l)" -eq 6 ]] || fail "not 6 steps"
  grep -q "DP 2 -> 1 (TP 4 and CP 2 kept; 32 ranks)" "$LAB/70b-straight.out" || fail "the changed degrees are not printed"
  grep -q "^published  *none" "$LAB/70b-straight.out" || fail "no published row"
  grep -q "^predicted, full scale  *mt-mfu --predict dgx-h100, 64 GPUs" "$LAB/70b-straight.out" || fail "no prediction row"
}

@test "scancel --signal=USR1 --batch: the job saves, exits 75, requeues itself and resumes to the straight run's numbers" {
  [[ -f "$LAB/70b-straight/run/train.restart-0.jsonl" ]] || skip "needs the straight run of the test before"
  local out="$LAB/70b-usr1" id
  id="$(MT_OUT="$out" MT_TRAIN_ITERS=6 submit "${TINY_70B[@]}" -o "$LAB/70b-usr1.out" "$MT_ROOT/recipes/llama70b_tp4_pp4.sh")"
  wait_for_step "$out/run/train.restart-0.jsonl" 2 300
  scancel --signal=USR1 --batch "$id"
  wait_job "$id" 400
  [[ "$(job_field "$id" JobState) $(job_field "$id" ExitCode) $(job_field "$id" Restarts)" == "COMPLETED 0:0 1" ]] \
    || fail "$(scontrol show job "$id"): $(cat "$LAB/70b-usr1.out")"
  # The first start saved on the signal and exited 75; mt-launch requeued the job.
  jq -e -s 'map(select(.record=="summary"))[0].stopped_by == "SIGUSR1"' "$out/run/train.restart-0.jsonl" >/dev/null \
    || fail "$(tail -2 "$out/run/train.restart-0.jsonl")"
  grep -q "exited 75 (stopped after a resumable checkpoint): requeueing job $id" "$LAB/70b-usr1.out" || fail "no requeue"
  grep -q "mt-shard: outputs verify, skipped" "$LAB/70b-usr1.out" || fail "the restart redid the data steps"
  grep -q "resuming from $out/checkpoints" "$LAB/70b-usr1.out" || fail "the restart did not --load"
  [[ -s "$out/run/provenance/restart-1/scontrol-show-job.txt" ]] || fail "no provenance of the restart"
  [[ "$(step_numbers "$out"/run/train.restart-{0,1}.jsonl)" == "$(step_numbers "$LAB/70b-straight/run/train.restart-0.jsonl")" ]] \
    || fail "$(step_numbers "$out"/run/train.restart-{0,1}.jsonl) against $(step_numbers "$LAB/70b-straight/run/train.restart-0.jsonl")"
  check_finished_run "$out" "$LAB/70b-usr1.out"
}

@test "a job reaching its time limit (--time=2, --signal=B:USR1@60) saves, exits 75, requeues and resumes to the straight run's numbers" {
  # LLaMA-3 8B's recipe, tiny (8 ranks), with more steps than fit before the warning (slurmctld
  # checks limits every 30 s and sends it up to 30 s early: here 30-60 s after the start; with @90
  # it came 5-24 s after, while the data was being prepared). Once the resumed run has 3 steps more
  # than the stopped one, both jobs are cancelled and the numbers compared with a straight run of
  # the same flags stopped at the same step.
  local out="$LAB/8b-limit" id iters=100000
  id="$(MT_OUT="$out" MT_TRAIN_ITERS=$iters MT_SAVE_INTERVAL=$iters submit "${TINY_8B[@]}" --time=2 --signal=B:USR1@60 \
    -o "$LAB/8b-limit.out" "$MT_ROOT/recipes/llama8b_cp2.sh")"
  local tries=900
  until [[ "$(job_field "$id" Restarts)" -ge 1 ]]; do
    tries=$((tries - 1)); [[ $tries -gt 0 ]] || fail "not requeued after 180 s: $(cat "$LAB/8b-limit.out")"; sleep 0.2
  done
  scontrol update jobid="$id" TimeLimit=15 >/dev/null  # the resumed start runs until cancelled
  local stopped_at
  stopped_at="$(jq -s 'map(select(.record=="step")) | last.iteration' "$out/run/train.restart-0.jsonl")"
  [[ "$stopped_at" -ge 1 ]] || fail "no step before the time-limit warning: $(cat "$LAB/8b-limit.out")"
  wait_job "$id" 300 RUNNING
  wait_for_step "$out/run/train.restart-1.jsonl" $((stopped_at + 3)) 300
  cancel_job "$id"
  wait_job "$id" 120 CANCELLED  # scancel ends the job: mt-train saves on SIGTERM, but it is not requeued
  jq -e -s 'map(select(.record=="summary"))[0].stopped_by == "SIGUSR1"' "$out/run/train.restart-0.jsonl" >/dev/null \
    || fail "$(tail -2 "$out/run/train.restart-0.jsonl")"
  grep -q "exited 75 (stopped after a resumable checkpoint): requeueing job $id" "$LAB/8b-limit.out" || fail "no requeue: $(cat "$LAB/8b-limit.out")"

  local straight="$LAB/8b-straight" sid
  sid="$(MT_OUT="$straight" MT_TRAIN_ITERS=$iters MT_SAVE_INTERVAL=$iters submit "${TINY_8B[@]}" -o "$LAB/8b-straight.out" \
    "$MT_ROOT/recipes/llama8b_cp2.sh")"
  wait_for_step "$straight/run/train.restart-0.jsonl" $((stopped_at + 3)) 300
  cancel_job "$sid"
  local resumed expected
  resumed="$(step_numbers "$out"/run/train.restart-{0,1}.jsonl | head -n $((stopped_at + 3)))"
  expected="$(step_numbers "$straight/run/train.restart-0.jsonl" | head -n $((stopped_at + 3)))"
  [[ "$resumed" == "$expected" ]] || fail "$resumed against $expected"
}

@test "every other dense recipe's tiny mode runs to its summary, and one row of each suite" {
  # Submitted together; Slurm runs them as the node's 32 CPUs allow.
  cd "$LAB"
  local -A jobs
  local recipe
  for recipe in llama8b_cp2 llama405b_tp8_pp8 gpt3_175b_tp4_pp8 gpt_177b_weak_scaling; do
    local resources=("${TINY_70B[@]}")
    [[ $recipe != llama8b_cp2 ]] || resources=("${TINY_8B[@]}")
    jobs[$recipe]="$(MT_OUT="$LAB/$recipe" submit "${resources[@]}" -o "$LAB/$recipe.out" "$MT_ROOT/recipes/$recipe.sh")"
  done
  local line
  line="$(MT_OUT="$LAB/fsdp-7b-tp4" bash "$MT_ROOT/recipes/fsdp_tp_scaling.sh" fsdp-7b-tp4)"
  jobs[fsdp-7b-tp4]="${line##* }"
  line="$(MT_OUT="$LAB/fsdp-7b-tp2-fsdp2" bash "$MT_ROOT/recipes/fsdp_tp_scaling.sh" fsdp-7b-tp2-fsdp2)"
  jobs[fsdp-7b-tp2-fsdp2]="${line##* }"
  line="$(MT_OUT="$LAB/gpt-tp4pp2-s512-sp-selective" bash "$MT_ROOT/recipes/gpt_bert_345m_recompute.sh" gpt-tp4pp2-s512-sp-selective)"
  jobs[gpt-tp4pp2-s512-sp-selective]="${line##* }"
  line="$(MT_OUT="$LAB/bert-tp2pp2-s512-sp-selective" bash "$MT_ROOT/recipes/gpt_bert_345m_recompute.sh" bert-tp2pp2-s512-sp-selective)"
  jobs[bert-tp2pp2-s512-sp-selective]="${line##* }"
  for recipe in "${!jobs[@]}"; do
    local id="${jobs[$recipe]}" out="$LAB/$recipe.out"
    wait_job "$id" 500
    [[ -f "$out" ]] || out="$(ls "$LAB"/mt-*-"$recipe"-"$id".out)"
    [[ "$(job_field "$id" JobState) $(job_field "$id" ExitCode)" == "COMPLETED 0:0" ]] || fail "$recipe: $(cat "$out")"
    check_finished_run "$LAB/$recipe" "$out"
  done
  grep -q "PP 8 -> 2 DP 8 -> 1 (TP 8 and CP 2 kept; 32 ranks)" "$LAB/llama405b_tp8_pp8.out" || fail "405B: degrees not printed"
  jq -e -s '.[0].parallel.decoder_first_pipeline_num_layers == 1 and .[0].parallel.decoder_last_pipeline_num_layers == 2' \
    "$LAB/llama405b_tp8_pp8/run/train.restart-0.jsonl" >/dev/null || fail "405B: uneven stages lost"
  grep -q "^published  *432.8 TFLOP/s per GPU, 44% MFU" "$LAB/gpt_177b_weak_scaling.out" || fail "177B: no published figure"
  jq -e -s '.[0].train.recompute_granularity == "selective" and .[0].parallel.sequence_parallel == true' \
    "$LAB/gpt-tp4pp2-s512-sp-selective/run/train.restart-0.jsonl" >/dev/null || fail "345M row: $(head -1 "$LAB/gpt-tp4pp2-s512-sp-selective/run/train.restart-0.jsonl")"
  # The TP + FSDP row: TP 2 x DP 2 with optim_grads_params and overlapped reduce-scatters, its
  # gathers and reduce-scatters timed in each step.
  jq -e -s '.[0].parallel.tensor_model_parallel_size == 2 and .[0].parallel.data_parallel_size == 2
    and .[0].parallel.use_megatron_fsdp and .[0].parallel.data_parallel_sharding_strategy == "optim_grads_params"
    and .[0].parallel.overlap_grad_reduce
    and ([.[] | select(.record == "step")] | length == 4 and all(.fsdp_gather_ms > 0 and .fsdp_reduce_ms > 0))' \
    "$LAB/fsdp-7b-tp2-fsdp2/run/train.restart-0.jsonl" >/dev/null || fail "FSDP row: $(head -1 "$LAB/fsdp-7b-tp2-fsdp2/run/train.restart-0.jsonl")"
  # The BERT row: tiny-bert on WordPiece sentences at TP2 PP2 DP2 with SP, lm loss and sop loss in each step.
  jq -e -s '.[0].model.bert == true and .[0].model.vocab_size == 3000 and .[0].parallel.tensor_model_parallel_size == 2
    and .[0].parallel.pipeline_model_parallel_size == 2 and .[0].train.recompute_granularity == "selective"
    and .[0].parallel.sequence_parallel == true
    and ([.[] | select(.record == "step")] | length == 4 and all(.lm_loss > 1 and .sop_loss > 0))' \
    "$LAB/bert-tp2pp2-s512-sp-selective/run/train.restart-0.jsonl" >/dev/null || fail "BERT row: $(head -1 "$LAB/bert-tp2pp2-s512-sp-selective/run/train.restart-0.jsonl")"
}

@test "teardown stops every daemon: none is left" {
  "$MT_ROOT/tests/slurm/cluster.sh" down "$LAB/state"
  local pid
  for pid in $(pgrep -x '(munged|slurmctld|slurmd|slurmstepd|slurmscriptd)' 2>/dev/null || true); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -q "^SLURM_CONF=$LAB/" ||
      tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$LAB/"; then
      fail "left behind: $pid $(tr '\0' ' ' <"/proc/$pid/cmdline")"
    fi
  done
  ! scontrol ping >/dev/null 2>&1 || fail "slurmctld still answers"
  [[ ! -S "$LAB/state/munge/munge.socket" ]] || fail "munged's socket is still there"
}
