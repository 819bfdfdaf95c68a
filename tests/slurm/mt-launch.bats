#!/usr/bin/env bats
# sbatch/mt-launch without a cluster: outside Slurm it runs one rank itself and N ranks under
# mpirun; its exit status is the command's; SIGUSR1 reaches the command (which saves and exits 75);
# under Slurm (faked: SLURM_JOB_ID and stand-ins for srun and scontrol in tests/slurm/fake) it
# starts ranks with `srun --mpi=pmix --kill-on-bad-exit=1`, writes the provenance files and on
# exit 75 calls `scontrol requeue JOBID` last, unless the stop came from SIGTERM (scancel); SIGTERM
# and SIGINT reach mpirun's ranks as SIGUSR1 (issue 28 L4: mpirun would end the job); bad
# options are one-line usage errors. The real
# cluster runs are tests/slurm/slurm.bats.

setup() {
  load ../tools/common
  mt_load_libs
  TMP="$(mktemp -d)"
  LAUNCH="$MT_ROOT/sbatch/mt-launch"
  export MT_RUN_DIR="$TMP/run"
  unset SLURM_JOB_ID SLURM_RESTART_COUNT SLURM_CPUS_PER_TASK SLURM_NNODES
}

teardown() { rm -rf "$TMP"; }

# Runs mt-launch with Slurm faked: job 4242, restart $1, srun and scontrol recording to $TMP/slurm.log.
fake_slurm() {
  local restart="$1"; shift
  SLURM_JOB_ID=4242 SLURM_RESTART_COUNT="$restart" SLURM_CPUS_PER_TASK=3 FAKE_SLURM_LOG="$TMP/slurm.log" \
    PATH="$MT_ROOT/tests/slurm/fake:$PATH" "$LAUNCH" "$@"
}

@test "outside Slurm: one rank runs the command itself, its status comes back, --output takes its stdout" {
  run_split "$LAUNCH" --output "$TMP/out.txt" -- bash -c 'echo record; exit 3'
  [[ $status -eq 3 ]] || fail "exited $status: $err"
  [[ "$(cat "$TMP/out.txt")" == record ]] || fail "$(cat "$TMP/out.txt")"
  grep -q '^MT_RUN_DIR=' "$MT_RUN_DIR/provenance/restart-0/environment.txt" || fail "no environment.txt"
  [[ ! -e "$MT_RUN_DIR/provenance/restart-0/scontrol-show-job.txt" ]] || fail "scontrol outside Slurm"
}

@test "outside Slurm: --ranks 2 starts two MPI ranks under mpirun" {
  run_split "$LAUNCH" --ranks 2 -- bash -c 'echo "rank $OMPI_COMM_WORLD_RANK of $OMPI_COMM_WORLD_SIZE"'
  [[ $status -eq 0 ]] || fail "$err"
  [[ "$(sort <<<"$out")" == $'rank 0 of 2\nrank 1 of 2' ]] || fail "$out"
}

@test "SIGUSR1 to mt-launch reaches the command, which saves and exits 75; outside Slurm nothing is requeued" {
  "$LAUNCH" -- bash -c 'trap "echo saved >'"$TMP"'/saved; exit 75" USR1; touch '"$TMP"'/ready; sleep 60 & wait' &
  local launcher=$!
  local tries=100
  until [[ -e "$TMP/ready" ]]; do tries=$((tries - 1)); [[ $tries -gt 0 ]] || fail "never started"; sleep 0.1; done
  kill -USR1 "$launcher"
  local status=0
  wait "$launcher" || status=$?
  [[ $status -eq 75 && -s "$TMP/saved" ]] || fail "exited $status"
}

@test "under Slurm: srun --mpi=pmix --kill-on-bad-exit=1 with the job's CPUs per task; provenance of each start" {
  run_split fake_slurm 0 --ranks 4 -- bash -c 'echo "threads $OMP_NUM_THREADS"'
  [[ $status -eq 0 && "$out" == "threads 3" ]] || fail "exited $status: $out $err"
  grep -qx 'srun --mpi=pmix --kill-on-bad-exit=1 --ntasks=4 --cpu-bind=cores --cpus-per-task=3' "$TMP/slurm.log" \
    || fail "$(cat "$TMP/slurm.log")"
  grep -q '^JobId=4242 ' "$MT_RUN_DIR/provenance/restart-0/scontrol-show-job.txt" || fail "no scontrol show job"
  grep -q '^SLURM_JOB_ID=4242$' "$MT_RUN_DIR/provenance/restart-0/environment.txt" || fail "no SLURM_ environment"
  run_split fake_slurm 1 -- true
  [[ -s "$MT_RUN_DIR/provenance/restart-1/environment.txt" ]] || fail "no provenance of restart 1"
}

@test "under Slurm: exit 75 requeues the job as mt-launch's last act; other exits do not" {
  run_split fake_slurm 0 -- bash -c 'exit 75'
  [[ $status -eq 75 ]] || fail "exited $status: $err"
  [[ "$(tail -1 "$TMP/slurm.log")" == "scontrol requeue 4242" ]] || fail "$(cat "$TMP/slurm.log")"
  : >"$TMP/slurm.log"
  run_split fake_slurm 0 -- bash -c 'exit 1'
  [[ $status -eq 1 ]] && ! grep -q requeue "$TMP/slurm.log" || fail "exited $status: $(cat "$TMP/slurm.log")"
  run_split env MT_REQUEUE=0 SLURM_JOB_ID=4242 FAKE_SLURM_LOG="$TMP/slurm.log" PATH="$MT_ROOT/tests/slurm/fake:$PATH" \
    "$LAUNCH" -- bash -c 'exit 75'
  [[ $status -eq 75 ]] && ! grep -q requeue "$TMP/slurm.log" || fail "MT_REQUEUE=0 requeued: $(cat "$TMP/slurm.log")"
}

@test "under Slurm: a stop on SIGTERM (scancel) exits 75 without requeueing the job" {
  SLURM_JOB_ID=4242 FAKE_SLURM_LOG="$TMP/slurm.log" PATH="$MT_ROOT/tests/slurm/fake:$PATH" \
    "$LAUNCH" -- bash -c 'trap "exit 75" TERM; touch '"$TMP"'/ready; sleep 60 & wait' 2>"$TMP/err" &
  local launcher=$!
  local tries=100
  until [[ -e "$TMP/ready" ]]; do tries=$((tries - 1)); [[ $tries -gt 0 ]] || fail "never started"; sleep 0.1; done
  kill -TERM "$launcher"
  local status=0
  wait "$launcher" || status=$?
  [[ $status -eq 75 ]] || fail "exited $status: $(cat "$TMP/err")"
  ! grep -q requeue "$TMP/slurm.log" || fail "requeued after SIGTERM: $(cat "$TMP/slurm.log")"
  grep -q "exited 75 after SIGTERM: the job ends (not requeued)" "$TMP/err" || fail "$(cat "$TMP/err")"
}

@test "bad options are one-line usage errors (exit 2)" {
  run_split "$LAUNCH" --ranks 0 -- true
  [[ $status -eq 2 && "$err" == "mt-launch: error: --ranks: expected a positive integer (got '0')" ]] || fail "$status $err"
  run_split "$LAUNCH" --nodes 2 -- true
  [[ $status -eq 2 && "$err" == "mt-launch: error: --nodes: unknown option (options: --ranks N, --output FILE)" ]] || fail "$status $err"
  run_split "$LAUNCH"
  [[ $status -eq 2 && "$(line_count "$err")" -eq 1 ]] || fail "$status $err"
}

@test "issue28 L4/U9: SIGTERM or SIGINT to mt-launch --ranks 2 reaches mt-train's ranks as a stop: they save, exit 75 with mt's last line, not requeued" {
  local -a run=(mt-train --model tiny-gpt --mock-data --vocab-size 97 --seq-length 16 --micro-batch-size 2
                --global-batch-size 8 --eval-iters 0 --train-iters 100000 --log-interval 1000000)
  local signal
  for signal in TERM INT; do
    rm -rf "$TMP/ck" "$TMP/run.jsonl"
    env --default-signal "$LAUNCH" --ranks 2 --output "$TMP/run.jsonl" -- "${run[@]}" --save "$TMP/ck" 2>"$TMP/err" &
    local launcher=$!
    # The signal must find training running (before MPI_Init ends a rank has no checkpoint to
    # save and exits at once); under CI's load the first step once took over 30 s to come.
    for _ in $(seq 1200); do grep -q '"record":"step"' "$TMP/run.jsonl" 2>/dev/null && break; sleep 0.1; done
    grep -q '"record":"step"' "$TMP/run.jsonl" || fail "SIG$signal: no step record after 120 s: $(cat "$TMP/err")"
    kill "-$signal" "$launcher"
    local status=0
    wait "$launcher" || status=$?
    [[ $status -eq 75 ]] || fail "SIG$signal: exited $status: $(cat "$TMP/err")"
    local saved
    saved="$(cat "$TMP/ck/latest_checkpointed_iteration.txt")"
    grep -qx "mt-launch: SIG$signal received: forwarded to mpirun (pid [0-9]*) as SIGUSR1 (mpirun would end the job on SIG$signal, with no save)" \
      "$TMP/err" || fail "SIG$signal: $(cat "$TMP/err")"
    grep -qx "\[rank 0\] mt-train: stopped by SIGUSR1 after iteration $saved of 100000; saved a checkpoint in $TMP/ck (resume with --load)" \
      "$TMP/err" || fail "SIG$signal: $(cat "$TMP/err")"
    ! grep -q -e "job has been aborted" -e "mpirun detected" "$TMP/err" || fail "SIG$signal: $(cat "$TMP/err")"
  done
}
