export PYTHONPATH=/tmp/site:.:.gpu_dense
mkdir -p ~/lce && cp -r .gpu_lce/. ~/lce/
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu_lce/whl/*.whl 2>&1 | tail -1
timeout 300 python3 benchmarks/bench_linear_ce.py --inputs random --iters 20 --warmup 2 --baseline kernels_start --only "ours none" "kernels_start none" "GEMMs only, 4 (chunked)" "GEMMs only, 4 (whole)" --out $OUT/bench_random_20.json 2>&1 | grep "^|"
