#!/usr/bin/env bash
# GPU call 8: call6.sh again on the tidied code (52275d7): the GStreamer CUDA pipelines.
set -uo pipefail
B=target/gpu-bundle
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/results.tgz -C $R . ; }
G=$PWD/target/gst-bundle
source $G/env.sh
PY="env -u LD_LIBRARY_PATH PYTHONPATH=$PWD/$B/py/site python3"
nvidia-smi -L > $R/gpu.txt 2>&1
gst-inspect-1.0 gpuringsink > $R/inspect-gpuringsink.txt 2>&1
gst-inspect-1.0 gpuringsrc > $R/inspect-gpuringsrc.txt 2>&1
gst-inspect-1.0 nvcodec > $R/inspect-nvcodec.txt 2>&1
echo "nvcodec elements: $(grep -E '^  [a-z0-9]+:' $R/inspect-nvcodec.txt | awk '{print $1}' | tr '\n' ' ')"
C=$G/bin/check

# 1. videotestsrc ! cudaupload ! gpuringsink -> Rust, PyTorch, gpuringsrc ! cudadownload, and
#    gpuringsrc into system memory: 300 frames each, every byte.
N=300
$C ref $N /tmp/ref.raw > $R/ref.log 2>&1
( timeout 150 $C rust g1 $N > $R/g1-rust.log 2>&1 & timeout 150 $PY gst/examples/torch_consumer.py g1 $N /tmp/ref.raw 240 320 > $R/g1-torch.log 2>&1 &
  timeout 150 $C gst g1 $N --via cudadownload > $R/g1-gst-cuda.log 2>&1 & timeout 150 $C gst g1 $N > $R/g1-gst-system.log 2>&1 &
  timeout 120 gst-launch-1.0 -q videotestsrc num-buffers=$N pattern=ball ! video/x-raw,format=RGBA,width=320,height=240 \
    ! cudaupload ! "video/x-raw(memory:CUDAMemory)" ! gpuringsink ring=g1 sync=false wait-for-consumers=4 > $R/g1-producer.log 2>&1
  echo "producer exit $?" >> $R/g1-producer.log; wait )
cat $R/g1-producer.log $R/g1-rust.log $R/g1-torch.log $R/g1-gst-cuda.log $R/g1-gst-system.log | tail -12
save

# 2. An H.264 file decoded by nvh264dec straight into the ring; the reference is the same
#    decoder's output, downloaded.
F=$G/data/ball720.h264
# Which NVDEC element decodes here (call 1: nvh264dec refused the caps): the first that does.
DEC=
for d in nvh264dec nvh264sldec; do
  GST_DEBUG=2,nvh264dec:5,nvh264sldec:5,nvdecoder:5 timeout 60 gst-launch-1.0 -q filesrc location=$F ! h264parse ! $d ! fakesink > $R/probe-$d.log 2>&1 \
    && { DEC=$d; break; }
done
gst-inspect-1.0 nvh264dec > $R/inspect-nvh264dec.txt 2>&1
echo "decoder: ${DEC:-none works}"; tail -5 $R/probe-nvh264dec.log
DEC=${DEC:-nvh264dec}
REF="filesrc location=$F ! h264parse ! $DEC ! cudadownload ! video/x-raw,format=NV12"
( timeout 150 $C rust h1 300 --ref "$REF" > $R/h1-rust.log 2>&1 & timeout 150 $C gst h1 300 --via cudadownload --ref "$REF" > $R/h1-gst-cuda.log 2>&1 &
  timeout 120 gst-launch-1.0 -q filesrc location=$F ! h264parse ! $DEC ! "video/x-raw(memory:CUDAMemory)" \
    ! gpuringsink ring=h1 sync=false wait-for-consumers=2 > $R/h1-producer.log 2>&1
  echo "producer exit $?" >> $R/h1-producer.log; wait )
cat $R/h1-producer.log $R/h1-rust.log $R/h1-gst-cuda.log | tail -8
save

