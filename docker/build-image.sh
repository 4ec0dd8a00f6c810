#!/usr/bin/env bash
# Builds the image that docker/compose.yaml runs, gpuring-example:local: FROM scratch with the
# pipeline example (built with features `cli` and `tokio`: its `--async` consumer) and the
# `gpuring` command, and exactly the shared libraries they load. Nothing is pulled.
#
#   docker/build-image.sh [--debug] [--tag TAG] [--nvrtc DIR] [-- CARGO_BUILD_ARGS...]
#
#   --debug         the debug build, target/debug, its debug info stripped in the image
#                   (default: release). tests/docker.rs builds it with its own features, which
#                   reuses what `cargo test` built.
#   --tag TAG       the image's name (default gpuring-example:local).
#   --nvrtc DIR     also copy NVRTC (DIR/libnvrtc*.so*, a CUDA toolkit's lib64; default
#                   $CUDA_HOME/lib64 when it has them): the pipeline compiles its kernels at
#                   run time with NVRTC, which the NVIDIA container runtime does not mount (it
#                   mounts the driver's libraries, libcuda). Without NVRTC the image runs host
#                   rings only, and `--memory cuda` fails at the first kernel.
#   -- ARGS         cargo build's feature arguments (default: --features cli,tokio), for
#                   example `-- --all-features`; they must include `cli` and `tokio`.
#
# The context is target/docker-context (or under CARGO_TARGET_DIR): the Dockerfile and
# rootfs/, the image's whole file system.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
features=(--features cli,tokio)
tag=gpuring-example:local
nvrtc=${CUDA_HOME:+$CUDA_HOME/lib64}
while [ $# -gt 0 ]; do
  case "$1" in
    --debug) profile=debug ;;
    --tag) tag=$2; shift ;;
    --nvrtc) nvrtc=$2; shift ;;
    --) shift; features=("$@"); break ;;
    *) sed -n '6p' "$0" >&2; exit 2 ;;
  esac
  shift
done

release=()
[ "$profile" = release ] && release=(--release)
cargo build "${release[@]}" "${features[@]}" --example pipeline --bin gpuring

target=${CARGO_TARGET_DIR:-target}
ctx=$target/docker-context
rm -rf "$ctx"
mkdir -p "$ctx/rootfs/usr/local/bin"
cp docker/Dockerfile "$ctx/"
bins=("$target/$profile/examples/pipeline" "$target/$profile/gpuring")
cp "${bins[@]}" "$ctx/rootfs/usr/local/bin/"
if [ "$profile" = debug ] && command -v strip >/dev/null; then
  strip --strip-debug "$ctx"/rootfs/usr/local/bin/*   # 200+ MiB each with it
fi
elves=("${bins[@]}")
if [ -n "$nvrtc" ] && compgen -G "$nvrtc/libnvrtc*.so*" >/dev/null; then
  mkdir -p "$ctx/rootfs/usr/lib/x86_64-linux-gnu"
  # -P: its version symlinks stay links (cudarc looks for several of the names).
  cp -P "$nvrtc"/libnvrtc*.so* "$ctx/rootfs/usr/lib/x86_64-linux-gnu/"
  elves+=("$nvrtc"/libnvrtc*.so.*)
  echo "build-image: NVRTC from $nvrtc" >&2
fi

# The libraries each file loads, as ldd resolves them here: `name => /path (addr)`, and the
# dynamic loader itself as `/path (addr)`. Each is copied to that same path in the image
# (where the loader's default search finds it), its symlinks resolved.
for f in "${elves[@]}"; do
  if ldd "$f" | grep -q 'not found'; then
    ldd "$f" >&2
    echo "build-image: $f needs a library this machine lacks" >&2
    exit 1
  fi
done
for lib in $(for f in "${elves[@]}"; do ldd "$f"; done |
  awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u); do
  mkdir -p "$ctx/rootfs$(dirname "$lib")"
  cp -L "$lib" "$ctx/rootfs$lib"
done
echo "build-image: $(cd "$ctx/rootfs" && find . -type f | sort | tr '\n' ' ')" >&2

# The classic builder where the buildx plugin is missing (a newer client would refuse to
# build without it, and BuildKit brings nothing to a two-line Dockerfile).
docker buildx version >/dev/null 2>&1 || export DOCKER_BUILDKIT=0
old=$(docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)
docker build --quiet -t "$tag" "$ctx" >/dev/null
# The image the tag named before, now nameless: removed (unless a container still uses it),
# so that rebuilds do not pile up.
if [ -n "$old" ] && [ "$old" != "$(docker image inspect -f '{{.Id}}' "$tag")" ]; then
  docker rmi "$old" >/dev/null 2>&1 || true
fi
echo "build-image: built $tag ($profile)" >&2
