#!/usr/bin/env bats
# Issue 28, a full disk (cases H1, C1, C3 and U5 of the 2026-11-27 probe): a periodic save, a
# --save-final, a --save-init and `mt-ckpt convert` on a full disk exit 1 within seconds saying "No
# space left on device" (no SIGSEGV from HDF5's exit handler, no hang inside a collective close
# under mpirun), leave no temporary and keep the earlier checkpoint named; a file-size limit
# (ulimit -f) is reported, not fatal; mt-shard names ENOSPC. A small tmpfs is mounted where the
# test may (root); the ENOSPC mode of MT_CHECKPOINT_FAULT covers the same paths everywhere.

setup() {
  load common
  mt_load_libs
  TMP="$(mktemp -d)"
  SMALL=""
  head -c 100000 "$MT_ROOT/data/demo/tinyshakespeare.txt" >"$TMP/tiny.txt"
  TR=(mt-train --model tiny-gpt --byte-data "$TMP/tiny.txt" --seq-length 32 --micro-batch-size 2
      --global-batch-size 4 --eval-iters 0)
}

teardown() {
  if [[ -n "$SMALL" ]]; then umount "$SMALL" 2>/dev/null || true; fi
  rm -rf "$TMP"
}

# A tmpfs of $1 MiB at $TMP/small, filled to leave about $2 KiB free; skips where mount is refused.
small_disk() {
  mkdir -p "$TMP/small"
  mount -t tmpfs -o size="$1m" tmpfs "$TMP/small" 2>/dev/null ||
    skip "cannot mount a tmpfs here (needs root); the MT_CHECKPOINT_FAULT=...:enospc tests cover the same paths"
  SMALL="$TMP/small"
  local free_kb
  free_kb="$(df -k --output=avail "$SMALL" | tail -1)"
  if ((free_kb > $2)); then dd if=/dev/zero of="$SMALL/fill" bs=1k count=$((free_kb - $2)) status=none 2>/dev/null || true; fi
}

# `expect_enospc SECONDS CMD...`: CMD exits 1 (not by a signal) within SECONDS, its stderr saying
# "No space left on device".
expect_enospc() {
  local limit="$1" start=$SECONDS
  shift
  run_split timeout 120 "$@"
  local took=$((SECONDS - start))
  [[ $status -eq 1 ]] || fail "$*: exit $status, not 1 (139: SIGSEGV, 124: hung): $err"
  [[ "$err" == *"No space left on device"* ]] || fail "$*: the error does not name ENOSPC: $err"
  ((took <= limit)) || fail "$*: took $took s"
}

# No temporary (nor headroom file) under $1.
no_temporaries() {
  local left
  left="$(find "$1" -name '*.tmp-*')"
  [[ -z "$left" ]] || fail "temporaries left: $left"
}

@test "C1: on a full disk --save, --save-final, --save-init and mt-ckpt convert exit 1 naming ENOSPC, no SIGSEGV, nothing left" {
  "${TR[@]}" --train-iters 2 --save "$TMP/ck" >/dev/null 2>&1 || fail "the source checkpoint"
  # Room to start the file but not for the checkpoint: the write itself fails.
  small_disk 16 300
  expect_enospc 60 "${TR[@]}" --train-iters 3 --save "$SMALL/ck"
  expect_enospc 60 "${TR[@]}" --train-iters 3 --save-final "$SMALL/final.h5"
  [[ "$err" == *"--save-final"* || "$err" == *"$SMALL/final.h5"* ]] || fail "the error names the file: $err"
  expect_enospc 60 "${TR[@]}" --train-iters 3 --save-init "$SMALL/init.h5"
  expect_enospc 60 mt-ckpt convert "$TMP/ck" "$SMALL/c.h5"
  no_temporaries "$SMALL"
  [[ ! -e "$SMALL/final.h5" && ! -e "$SMALL/init.h5" && ! -e "$SMALL/c.h5" ]] || fail "a failed save left its file: $(ls "$SMALL")"
  # No room at all: refused before HDF5 creates the file (whose failed create HDF5 cannot undo).
  dd if=/dev/zero of="$SMALL/more" bs=1k count=1000 status=none 2>/dev/null || true
  expect_enospc 60 "${TR[@]}" --train-iters 2 --save-final "$SMALL/final.h5"
  [[ "$err" == *"cannot reserve 64 KiB of disk beside it for the save: No space left on device"* ]] || fail "$err"
  no_temporaries "$SMALL"
}

@test "C1: MT_CHECKPOINT_FAULT=mid-tensor:enospc: the save fails naming ENOSPC, no SIGSEGV, the earlier checkpoint stays named" {
  "${TR[@]}" --train-iters 2 --save "$TMP/ck" >/dev/null 2>&1 || fail "the first checkpoint"
  MT_CHECKPOINT_FAULT=mid-tensor:enospc expect_enospc 60 "${TR[@]}" --train-iters 4 --load "$TMP/ck" --save "$TMP/ck" \
    --override-opt_param-scheduler
  [[ "$err" == *"write of tensor "*" failed: No space left on device"* ]] || fail "$err"
  [[ "$(cat "$TMP/ck/latest_checkpointed_iteration.txt")" == 2 ]] || fail "the tracker moved"
  mt-ckpt verify "$TMP/ck" >/dev/null || fail "the earlier checkpoint does not verify"
  MT_CHECKPOINT_FAULT=mid-tensor:enospc expect_enospc 60 "${TR[@]}" --train-iters 2 --save-final "$TMP/final.h5"
  MT_CHECKPOINT_FAULT=mid-tensor:enospc expect_enospc 60 mt-ckpt convert "$TMP/ck" "$TMP/c.h5"
  no_temporaries "$TMP"
  [[ ! -e "$TMP/final.h5" && ! -e "$TMP/c.h5" ]] || fail "a failed save left its file"
}

@test "H1: under mpirun (2 ranks, TP 2) a save on a full disk ends every rank with exit 1 naming ENOSPC in seconds" {
  MT_CHECKPOINT_FAULT=mid-tensor:enospc expect_enospc 100 mpirun -np 2 --oversubscribe -x MT_CHECKPOINT_FAULT \
    "${TR[@]}" --train-iters 2 --save "$TMP/ck" --tensor-model-parallel-size 2
  no_temporaries "$TMP"
  # Room for the 4 MiB headroom a group keeps for its collective close, not for the checkpoint.
  small_disk 16 4300
  expect_enospc 100 mpirun -np 2 --oversubscribe "${TR[@]}" --train-iters 20 --save "$SMALL/ck" --save-interval 5 \
    --tensor-model-parallel-size 2
  no_temporaries "$SMALL"
}

@test "C3: a save past ulimit -f is reported (File too large), not killed by SIGXFSZ" {
  run_split bash -c 'ulimit -f 200; exec "$@"' sh "${TR[@]}" --train-iters 2 --save "$TMP/ck"
  [[ $status -eq 1 && "$err" == *"File too large"* ]] || fail "exit $status (153: killed by SIGXFSZ): $err"
  no_temporaries "$TMP"
}

@test "U5: mt-shard build on a full disk names ENOSPC" {
  "$BATS_TEST_DIRNAME/make_token_dataset.py" "$TMP/a" h5 100 0 counting:2000:20:1
  small_disk 2 64
  expect_enospc 60 mt-shard build --data-path "$TMP/a" --seq-length 16 --train-iters 4000 --global-batch-size 64 \
    --eval-iters 1 --split 90,5,5 --output "$SMALL/idx.h5"
  no_temporaries "$SMALL"
}
