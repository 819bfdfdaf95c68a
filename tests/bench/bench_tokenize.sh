#!/usr/bin/env bash
# Tokenizer throughput: mt-tokenize against tiktoken and HF tokenizers on the same corpus in the
# same run, for GPT-2 and cl100k, with 1 thread and all threads. Also mt-tokenize's end-to-end
# preprocess (JSONL -> token dataset) against encode-only, and how the time grows on
# pathological runs (10^5 vs 10^6 letters, spaces, digits). A benchmark, not a test: it prints
# figures (MB/s = 10^6 input bytes per second, median of 3 runs) and asserts nothing.
# Usage: tests/bench/bench_tokenize.sh [corpus.txt]   (default data/corpus/war_and_peace_pg2600.txt)
# Env: MT_BIN (mt binaries, default build/bin),
#      MT_BENCH_MB (corpus repeated to about this size, default 20), MT_BENCH_THREADS (default nproc),
#      MT_BENCH_PYTHON (an interpreter with tiktoken and tokenizers; default: a temporary venv).
# mt-tokenize timings include process start and tokenizer loading (printed separately as "load").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MT_BIN="${MT_BIN:-$ROOT/build/bin}"
TOK="$ROOT/data/tokenizers"
CORPUS="${1:-$ROOT/data/corpus/war_and_peace_pg2600.txt}"
TARGET_MB="${MT_BENCH_MB:-20}"
THREADS="${MT_BENCH_THREADS:-$(nproc)}"
RUNS=3
REF="$ROOT/tests/bench/tokenize_reference.py"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Reference interpreter: a venv with the versions the goldens were made with.
if [[ -n "${MT_BENCH_PYTHON:-}" ]]; then
  read -r -a PY <<<"$MT_BENCH_PYTHON"
else
  echo "bench: making a venv with tiktoken and tokenizers" >&2
  python3 -m venv "$work/venv"
  "$work/venv/bin/python" -m pip install -q --disable-pip-version-check tiktoken==0.14.0 tokenizers==0.23.3 >&2
  PY=("$work/venv/bin/python")
fi
ref() { "${PY[@]}" "$REF" "$@"; }

MT=""
[[ -x "$MT_BIN/mt-tokenize" ]] && MT="$MT_BIN/mt-tokenize"
[[ -n "$MT" ]] || echo "bench: $MT_BIN/mt-tokenize not found (set MT_BIN); measuring the references only" >&2

# The corpus, repeated to about TARGET_MB.
text="$work/corpus.txt"
: >"$text"
while [[ $(stat -c %s "$text") -lt $((TARGET_MB * 1000000)) ]]; do cat "$CORPUS" >>"$text"; done
bytes=$(stat -c %s "$text")
ref make-jsonl --input "$text" --output "$work/corpus.jsonl"
echo "bench: corpus $(basename "$CORPUS") repeated to $bytes bytes; threads 1 and $THREADS; $(nproc) cores" >&2

tok_flags() {
  case "$1" in
    gpt2) echo "--tokenizer-type GPT2BPETokenizer --vocab-file $TOK/gpt2/encoder.json --merge-file $TOK/gpt2/vocab.bpe" ;;
    cl100k) echo "--tokenizer-type TikTokenizer --tokenizer-model $TOK/cl100k_base/cl100k_base.tiktoken" ;;
  esac
}

# Median wall time in seconds of RUNS runs of a command (stdout discarded); 0 when it fails.
median_time() {
  local times=() t0 t1 i
  for ((i = 0; i < RUNS; i++)); do
    t0=$EPOCHREALTIME
    if ! "$@" >/dev/null 2>"$work/stderr"; then
      echo "bench: failed: ${*:1:3} ...: $(tail -n 1 "$work/stderr")" >&2
      echo 0
      return
    fi
    t1=$EPOCHREALTIME
    times+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.6f", b-a}')")
  done
  printf '%s\n' "${times[@]}" | sort -g | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}'
}
mbps() { awk -v b="$1" -v t="$2" 'BEGIN{ if (t > 0) printf "%.2f", b/1e6/t; else print "n/a" }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (a != "n/a" && b != "n/a" && b > 0) printf "%.2fx", a/b; else print "-" }'; }
jget() { "${PY[@]}" -c 'import json,sys; print(json.loads(sys.stdin.read())[sys.argv[1]])' "$1"; }

declare -A R  # R[tokenizer,impl,threads] = MB/s
for tk in gpt2 cl100k; do
  # shellcheck disable=SC2207
  flags=($(tok_flags "$tk"))
  for n in 1 "$THREADS"; do
    [[ $n == 1 && -n "${R[$tk,tiktoken,1]:-}" ]] && continue
    if [[ -n "$MT" ]]; then
      t=$(median_time "$MT" encode --raw --input "$text" --workers "$n" "${flags[@]}")
      R[$tk,mt,$n]=$(mbps "$bytes" "$t")
    else
      R[$tk,mt,$n]=n/a
    fi
    R[$tk,tiktoken,$n]=$(ref throughput --impl tiktoken --tokenizer "$tk" --threads "$n" --input "$text" --runs $RUNS | jget mb_per_s)
    R[$tk,hf,$n]=$(ref throughput --impl hf --tokenizer "$tk" --threads "$n" --input "$text" --runs $RUNS \
      --cache "$work/hf_$tk.json" | jget mb_per_s)
  done
  # Correctness on the bench corpus: mt's id count against tiktoken's (whole text, one document).
  if [[ -n "$MT" ]]; then
    R[$tk,load]=$(median_time "$MT" encode --raw --input /dev/null --workers 1 "${flags[@]}")
    mt_tokens=$("$MT" encode --raw --input "$text" --workers "$THREADS" "${flags[@]}" 2>/dev/null | wc -w || true)
    tt_tokens=$(ref count --tokenizer "$tk" --input "$text" | jget tokens)
    R[$tk,check]="ids: mt $mt_tokens, tiktoken $tt_tokens $([[ $mt_tokens == "$tt_tokens" ]] && echo equal || echo DIFFERENT)"
  fi
done

printf '\n%-7s %-14s %7s %9s %13s %9s\n' tokenizer implementation threads "MB/s" "mt/this impl" "N/1"
for tk in gpt2 cl100k; do
  for impl in mt tiktoken hf; do
    for n in 1 "$THREADS"; do
      name=$impl; [[ $impl == mt ]] && name=mt-tokenize; [[ $impl == hf ]] && name=hf-tokenizers
      vs_mt=-; [[ $impl == mt ]] || vs_mt=$(ratio "${R[$tk,mt,$n]}" "${R[$tk,$impl,$n]}")
      scale=-; [[ $n == 1 ]] || scale=$(ratio "${R[$tk,$impl,$n]}" "${R[$tk,$impl,1]}")
      printf '%-9s %-14s %7s %9s %13s %9s\n' "$tk" "$name" "$n" "${R[$tk,$impl,$n]}" "$vs_mt" "$scale"
      if [[ $n == "$THREADS" ]]; then break; fi
    done
  done
  if [[ -n "${R[$tk,check]:-}" ]]; then echo "          mt-tokenize start+load ${R[$tk,load]} s; ${R[$tk,check]}"; fi
done

# End-to-end preprocess (JSONL -> HDF5 + .bin/.idx) against encode-only, same text, all threads.
if [[ -n "$MT" ]]; then
  printf '\n%-9s %-32s %7s %9s %s\n' tokenizer "mt-tokenize run" threads "MB/s" "preprocess/encode"
  for tk in gpt2 cl100k; do
    # shellcheck disable=SC2207
    flags=($(tok_flags "$tk"))
    for fmt in hdf5 both; do
      t=$(median_time "$MT" --input "$work/corpus.jsonl" --json-keys text --output-prefix "$work/pre_$tk" \
        --workers "$THREADS" --output-format "$fmt" --append-eod "${flags[@]}")
      pre=$(mbps "$bytes" "$t")
      reported=$("$MT" --input "$work/corpus.jsonl" --json-keys text --output-prefix "$work/pre_$tk" \
        --workers "$THREADS" --output-format "$fmt" --append-eod "${flags[@]}" 2>/dev/null | tail -n 1 |
        jget mb_per_s 2>/dev/null | awk '{printf "%.2f", $1}' || echo "?")
      printf '%-9s %-32s %7s %9s %s (tool reports %s MB/s)\n' "$tk" "preprocess --output-format $fmt" "$THREADS" "$pre" \
        "$(ratio "$pre" "${R[$tk,mt,$THREADS]}")" "$reported"
      rm -f "$work/pre_$tk"*
    done
    printf '%-9s %-32s %7s %9s\n' "$tk" "encode --raw" "$THREADS" "${R[$tk,mt,$THREADS]}"
  done
fi

# Pathological runs: t(10^6) / t(10^5) (10 = linear). For mt the time is the encode time that
# mt-tokenize reports on stderr ("... N bytes, X MB/s"; tokenizer loading excluded), falling back to
# wall time minus an empty-input run when that line is missing.
mt_encode_seconds() {  # file flags... -> median seconds
  local times=() i line t
  for ((i = 0; i < RUNS; i++)); do
    line=$("$MT" encode --raw --input "$@" --workers 1 2>&1 >/dev/null | grep '^mt-tokenize encode:' || true)
    t=$(sed -nE 's/.* ([0-9]+) bytes, ([0-9.]+) MB\/s.*/\1 \2/p' <<<"$line" | awk '$2 > 0 {printf "%.6f", $1/1e6/$2}')
    if [[ -z "$t" ]]; then
      local t_empty t_file
      t_empty=$(median_time "$MT" encode --raw --input /dev/null --workers 1 "${@:2}")
      t_file=$(median_time "$MT" encode --raw --input "$@" --workers 1)
      awk -v a="$t_empty" -v b="$t_file" 'BEGIN{x=b-a; if (x < 1e-6) x = 1e-6; printf "%.6f\n", x}'
      return
    fi
    times+=("$t")
  done
  printf '%s\n' "${times[@]}" | sort -g | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}'
}

printf '\n%-9s %-8s %-14s %10s %10s %8s\n' tokenizer run implementation "t(1e5) s" "t(1e6) s" ratio
for tk in gpt2 cl100k; do
  # shellcheck disable=SC2207
  flags=($(tok_flags "$tk"))
  declare -A TT=()
  while read -r line; do
    kind=$(jget run <<<"$line")
    TT[$kind]="$(jget t_1e5 <<<"$line") $(jget t_1e6 <<<"$line") $(jget ratio <<<"$line")"
  done < <(ref scaling --tokenizer "$tk" --runs $RUNS)
  for kind in letters spaces digits; do
    if [[ -n "$MT" ]]; then
      ch=a; [[ $kind == spaces ]] && ch=' '; [[ $kind == digits ]] && ch=7
      for n in 100000 1000000; do
        head -c "$n" /dev/zero | tr '\0' "$ch" >"$work/run_$n.txt"
      done
      t5=$(mt_encode_seconds "$work/run_100000.txt" "${flags[@]}")
      t6=$(mt_encode_seconds "$work/run_1000000.txt" "${flags[@]}")
      printf '%-9s %-8s %-14s %10.5f %10.5f %8s\n' "$tk" "$kind" mt-tokenize "$t5" "$t6" \
        "$(awk -v a="$t5" -v b="$t6" 'BEGIN{ if (a > 0) printf "%.2f", b/a; else print "-" }')"
    fi
    read -r a b c <<<"${TT[$kind]}"
    printf '%-9s %-8s %-14s %10.5f %10.5f %8s\n' "$tk" "$kind" tiktoken "$a" "$b" "$c"
  done
  unset TT
done
