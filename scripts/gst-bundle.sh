#!/usr/bin/env bash
# gst-bundle: the GStreamer plugin, its checker and this machine's GStreamer (Debian 12's
# 1.22: tools, the plugins the GPU runs use, every library they load) in one folder, for a
# machine that has no GStreamer (the GPU machine). Its env.sh points GStreamer there.
#
#   scripts/gst-bundle.sh [OUT]     default target/gst-bundle
#   then there:  source OUT/env.sh; gst-launch-1.0 ... ; OUT/bin/check ...
set -euo pipefail
out=${1:-target/gst-bundle}
cargo build --release -p gst-plugin-gpuring --lib --examples
rm -rf "$out"; mkdir -p "$out"/{bin,lib,plugins,gpuring}
cp target/release/libgstgpuring.so "$out/gpuring/"
cp target/release/examples/check "$out/bin/"
cp /usr/bin/gst-launch-1.0 /usr/bin/gst-inspect-1.0 "$out/bin/"
cp /usr/lib/x86_64-linux-gnu/gstreamer1.0/gstreamer-1.0/gst-plugin-scanner "$out/bin/"
gp=/usr/lib/x86_64-linux-gnu/gstreamer-1.0
for p in coreelements videotestsrc app videoconvertscale nvcodec shm videoparsersbad imagefreeze; do
  cp "$gp/libgst$p.so" "$out/plugins/"
done
# Every library these load, except the C runtime and the C++ runtime (the GPU machine's own,
# newer ones are used) and the CUDA driver.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcuda)'
for f in "$out"/bin/* "$out"/plugins/*.so "$out"/gpuring/*.so; do
  ldd "$f" 2>/dev/null | awk '/=> \//{print $1" "$3}'
done | sort -u | while read -r name path; do
  echo "$name" | grep -Eq "$skip" || cp -L "$path" "$out/lib/$name"
done
strip --strip-unneeded "$out"/lib/* "$out"/plugins/* "$out"/gpuring/* "$out"/bin/* 2>/dev/null || true
cat > "$out/env.sh" <<'SH'
# Source me: GStreamer and the gpuring plugin from this folder.
GST_BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH=$GST_BUNDLE/bin:$PATH LD_LIBRARY_PATH=$GST_BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export GST_PLUGIN_SYSTEM_PATH_1_0=$GST_BUNDLE/plugins GST_PLUGIN_PATH_1_0=$GST_BUNDLE/gpuring
export GST_PLUGIN_SCANNER_1_0=$GST_BUNDLE/bin/gst-plugin-scanner GST_REGISTRY_1_0=/tmp/gst-registry.bin
SH
du -sh "$out"
# An H.264 file for the decoder pipeline (300 frames of 1280x720), made here with x264enc: the
# GPU machine has no encoder (an H100 has no NVENC).
mkdir -p "$out/data"
if gst-inspect-1.0 x264enc >/dev/null 2>&1; then
  gst-launch-1.0 -q videotestsrc num-buffers=300 pattern=ball ! video/x-raw,width=1280,height=720,framerate=30/1 \
    ! x264enc key-int-max=30 ! video/x-h264,profile=high ! h264parse \
    ! video/x-h264,stream-format=byte-stream,alignment=au ! filesink location="$out/data/ball720.h264"
fi
du -sh "$out"
