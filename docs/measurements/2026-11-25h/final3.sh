export PYTHONPATH=/tmp/site:.:.gpu_dense
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu_lce/whl/*.whl 2>&1 | tail -1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/gpu.txt
timeout 420 python3 benchmarks/bench_linear_ce.py --inputs random --iters 10 --warmup 2 --baseline kernels_start --only "ours none" "ours exact" "kernels_start none" "CCE" "torch.compile" "GEMMs only, 4 (chunked)" "GEMMs only, 4 (whole)" --out $OUT/bench_random.json 2>&1 | grep "^|"
