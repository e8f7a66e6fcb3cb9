export PYTHONPATH=/tmp/site:.:.gpu_dense
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $OUT/gpu.txt
git log -1 --format=%H > $OUT/code.txt 2>/dev/null; git diff --stat >> $OUT/code.txt 2>/dev/null
timeout 290 python3 benchmarks/bench_linear_ce.py --inputs real --real ~/lce/gemma3-270m --iters 20 --warmup 3 --baseline kernels_head --only "ours exact" "ours loose" "ours none" "kernels_head exact" "kernels_head none" "torch.compile" "CCE" "GEMMs only, 4 (chunked)" --out $OUT/bench_real.json 2>&1 | grep "^|"
timeout 290 python3 benchmarks/bench_linear_ce.py --inputs random --iters 10 --warmup 2 --baseline kernels_head --only "ours none" "ours exact" "kernels_head none" "CCE" "torch.compile" "GEMMs only, 4 (chunked)" "GEMMs only, 4 (whole)" --out $OUT/bench_random.json 2>&1 | grep "^|"
