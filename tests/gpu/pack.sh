#!/usr/bin/env bash
# Packs what tests/gpu/run_on_gpu.sh runs on a GPU machine into one compressed archive,
# .gpu/mt-gpu.tar.xz at the repository root (git-ignored): the stripped mt binaries (build/bin),
# the stripped GPU test and benchmark binaries (build/tests/mt_gpu_*, mt_bench_gpu_*), and every shared library `ldd` names
# for them that is neither part of glibc nor a CUDA library (oneDNN, HDF5, OpenMPI, hwloc,
# libevent, libstdc++, ...). CUDA libraries (cudart, cuBLAS, cuBLASLt, NCCL, the driver) are never
# packed: run_on_gpu.sh finds them on the GPU machine (the CUDA toolkit or PyTorch's nvidia/*
# wheels) and prints their versions. The archive must stay under 64 MiB together with the
# repository's tracked files (all that travels to the GPU machine); the script fails otherwise.
#   tests/gpu/pack.sh [BUILD_DIR]      (default: build; build the binaries first)
# Tested by hand: pack, unpack in a temporary directory and run run_on_gpu.sh against it on a
# machine without a GPU (every GPU part skipped); see README "Running on a GPU".
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build}" && pwd)"
OUT_DIR="$ROOT/.gpu"
ARCHIVE="$OUT_DIR/mt-gpu.tar.xz"
LIMIT=$((64 * 1024 * 1024))

die() { echo "pack.sh: $*" >&2; exit 1; }

binaries=()
for b in "$BUILD"/bin/mt-*; do [[ -x $b && -f $b ]] && binaries+=("$b"); done
for b in "$BUILD"/tests/mt_gpu_* "$BUILD"/tests/mt_bench_gpu_*; do [[ -x $b && -f $b ]] && binaries+=("$b"); done
[[ -x $BUILD/bin/mt-train ]] || die "$BUILD/bin/mt-train is missing: build first (./setup.sh build)"
compgen -G "$BUILD/tests/mt_gpu_*" >/dev/null || die "no $BUILD/tests/mt_gpu_* test binaries: build with the CUDA backend on"

# glibc's own libraries and the CUDA libraries: never packed.
skip_library() {
  case "$1" in
    linux-vdso.so.* | ld-linux-x86-64.so.* | libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | \
      libresolv.so.* | libutil.so.* | libgcc_s.so.*) return 0 ;;
    libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libnccl.so.* | libnvrtc* | libnvJitLink* | \
      libcusparse* | libcufft* | libcurand* | libnvidia-*) return 0 ;;
  esac
  return 1
}

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/mt-gpu/bin" "$stage/mt-gpu/tests" "$stage/mt-gpu/lib"

for b in "${binaries[@]}"; do
  case "$b" in
    "$BUILD"/bin/*) dest="$stage/mt-gpu/bin/" ;;
    *) dest="$stage/mt-gpu/tests/" ;;
  esac
  strip --strip-unneeded -o "$dest$(basename "$b")" "$b"
done

declare -A packed=()
while read -r name path; do
  skip_library "$name" && continue
  [[ -n ${packed[$name]:-} ]] && continue
  [[ -f $path ]] || die "ldd names $name at '$path', which does not exist"
  strip --strip-unneeded -o "$stage/mt-gpu/lib/$name" "$(readlink -f "$path")"
  packed[$name]=1
done < <(for b in "${binaries[@]}"; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u)

{
  echo "packed $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  echo "libraries: ${!packed[*]}"
} >"$stage/mt-gpu/PACKED"

mkdir -p "$OUT_DIR"
tmp="$ARCHIVE.tmp.$$"
tar -C "$stage" -cf - mt-gpu | xz -T2 -6 >"$tmp"
size=$(stat -c %s "$tmp")
tracked=$(git -C "$ROOT" ls-files -z | (cd "$ROOT" && xargs -0 stat -c %s 2>/dev/null) | awk '{s += $1} END {print s + 0}')
if ((size + tracked >= LIMIT)); then
  rm -f "$tmp"
  die "the archive ($((size >> 20)) MiB) and the tracked files ($((tracked >> 20)) MiB) exceed 64 MiB"
fi
mv "$tmp" "$ARCHIVE"
echo "pack.sh: $ARCHIVE: $((size >> 20)) MiB ($size bytes; with the tracked files $(((size + tracked) >> 20)) of 64 MiB)," \
  "${#binaries[@]} binaries, ${#packed[@]} libraries"
