export PYTHONPATH=/tmp/site:.:.gpu_dense
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu_lce/whl/*.whl 2>&1 | tail -1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
timeout 220 python3 benchmarks/bench_linear_ce.py --inputs real --real .gpu_lce/smollm2-135m --iters 20 --warmup 3 --baseline kernels_head --only "ours exact" "ours none" "kernels_head exact" "torch.compile" --out $OUT/bench_real_smollm2.json 2>&1 | grep "^|"
timeout 250 python3 benchmarks/bench_linear_ce.py --inputs random --iters 12 --warmup 2 --baseline kernels_head --only "ours exact" "ours none" "kernels_head exact" --out $OUT/bench_random_exact.json 2>&1 | grep "^|"
