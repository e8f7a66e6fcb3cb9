#!/usr/bin/env bash
# Ray's autoscaler on one machine, end to end: a head with no CPUs (tests/cluster/local.yaml, fake multi-node
# provider), the tiny sweep submitted as a Ray job, worker nodes added for its pending trials, the sweep finished,
# the cluster stopped. Output: docs/measurements/autoscale_local.txt. Usage: bash tests/cluster/autoscale_local.sh
# Not in CI: it starts a second Ray cluster (head + up to two raylets) beside pytest's, ~3-5 min on 2 cores.
# It never runs `ray stop` (that stops every Ray process of the machine, other users' too): it ends its own head's
# process group and any raylet of its own temp dir, by pid.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
work=$(mktemp -d /tmp/calsweep-autoscale.XXXX)
port=$((20000 + RANDOM % 10000)) dashboard=$((30000 + RANDOM % 10000))
export RAY_FAKE_CLUSTER=1 RAY_USAGE_STATS_ENABLED=0
export CALSWEEP_DATA_DIR="${CALSWEEP_DATA_DIR:-$(cd .. && pwd)/shared/data}" HF_HUB_OFFLINE=1
setsid ray start --head --block --port "$port" --dashboard-port "$dashboard" --temp-dir "$work/ray" \
    --autoscaling-config "$repo/tests/cluster/local.yaml" >"$work/head.log" 2>&1 &
head=$!
stop() {
  kill -TERM -- "-$head" 2>/dev/null || true; sleep 5
  for pid in $(pgrep -f -- "$work/ray" || true); do kill -KILL "$pid" 2>/dev/null || true; done  # its own raylets
}
trap stop EXIT
until ray status --address "127.0.0.1:$port" >/dev/null 2>&1; do sleep 2; done
echo "== $(date -u +%FT%TZ) head up; before the job:"; ray status --address "127.0.0.1:$port" | sed -n '/Node status/,/Demands/p'
ray job submit --address "http://127.0.0.1:$dashboard" -- \
    python "$repo/sweeps/launch.py" --config "$repo/tests/sweeps/tiny_sweep.yaml" --address auto \
    --results-dir "$work/results" resources.cpus_per_worker=0.9 resources.max_concurrent_trials=2 &
job=$!
for _ in $(seq 60); do  # the autoscaler adds the worker nodes the pending trials ask for
  sleep 5
  if ray status --address "127.0.0.1:$port" | grep -q "ray.worker.cpu"; then break; fi
done
echo "== $(date -u +%FT%TZ) while trials wait:"; ray status --address "127.0.0.1:$port" | sed -n '/Node status/,/Demands/p'
wait "$job"
echo "== $(date -u +%FT%TZ) job done; rows in the store:"
python -c "from sweeps import store; t = store.read_trials('$work/results', 'tiny'); print(t.select(['trial_id', 'status', 'node_id']).to_pandas().to_string())"
