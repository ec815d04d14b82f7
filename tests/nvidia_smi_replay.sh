#!/bin/sh
# Stands in for nvidia-smi on a machine without a GPU. It replays the REAL output of an NVIDIA
# H200 (driver 580) captured in tests/fixtures/nvidia-smi/h200/, for exactly the arguments the
# portal runs (clusters/gpu_metrics.py), and fails as nvidia-smi does on any others.
#   NVIDIA_SMI_REPLAY=idle (default) | busy   which capture to replay
#   NVIDIA_SMI_REPLAY=hang                     never answers (a driver in trouble)
#   NVIDIA_SMI_REPLAY=nodriver                 nvidia-smi's answer on a machine with no driver
fixtures="${NVIDIA_SMI_FIXTURES:-$(dirname "$0")/fixtures/nvidia-smi/h200}"
state="${NVIDIA_SMI_REPLAY:-idle}"
case "$state" in
  hang) exec sleep 60 ;;
  nodriver)
    echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
    exit 9 ;;
  idle|busy) ;;
  *) echo "unknown NVIDIA_SMI_REPLAY=$state" >&2; exit 2 ;;
esac
gpu_query="--query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu,utilization.memory,temperature.gpu,power.draw,clocks.sm,ecc.mode.current"
apps_query="--query-compute-apps=pid,gpu_uuid,used_memory,process_name"
if [ "$#" -eq 1 ] && [ "$1" = "-L" ]; then
  exec cat "$fixtures/nvidia-smi-L.txt"
elif [ "$#" -eq 2 ] && [ "$1" = "$gpu_query" ] && [ "$2" = "--format=csv,noheader,nounits" ]; then
  exec cat "$fixtures/query-gpu-$state.csv"
elif [ "$#" -eq 2 ] && [ "$1" = "$apps_query" ] && [ "$2" = "--format=csv,noheader,nounits" ]; then
  # Captured while busy; an idle GPU runs no process, and nvidia-smi then prints nothing.
  [ "$state" = busy ] && exec cat "$fixtures/query-compute-apps-busy.csv"
  exit 0
fi
echo "nvidia-smi replay: no capture for these arguments: $*" >&2
exit 2
