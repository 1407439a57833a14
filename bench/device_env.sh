# Sourced by the device-call drivers (device_session.sh, session_call.sh, ncu_*.sh):
# `device_env LOGDIR` installs the carried .whl/*.whl (the FLA peer etc.) into /tmp/site, logging to
# LOGDIR/wheels.log, and sets PYTHONPATH to that site (if any) and the checkout.
device_env() {
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl > "$1/wheels.log" 2>&1
    export PYTHONPATH="/tmp/site:$PWD"
  else
    export PYTHONPATH="$PWD"
  fi
}

# The Nsight Compute sections the ncu drivers (ncu_attention_moe.sh, ncu_gemv.sh) collect per
# kernel: speed of light, warp states, scheduler, memory, occupancy, launch.
NCU_SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats"

# `decode_figures LOG`: one line of an `ninfer-bench decode` log's rows, "B=1 4.537 ms r=0.86 | ..."
# (batch, gpu ms, roofline ratio), for the drivers' summaries.
decode_figures() {
  grep -E '^ *[0-9]+ +[0-9]+\.[0-9]+ ' "$1" | awk '{printf "B=%s %s ms r=%s | ", $1, $2, $8}'
}
