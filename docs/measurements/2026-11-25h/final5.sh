export PYTHONPATH=/tmp/site:.:.gpu_dense
mkdir -p ~/lce && cp -r .gpu_lce/. ~/lce/
ls -la ~/lce/gemma3-270m/
timeout 420 python3 benchmarks/bench_linear_ce.py --inputs real --real ~/lce/gemma3-270m --iters 20 --warmup 3 --baseline kernels_start --only "ours exact" "ours loose" "ours none" "kernels_start exact" "kernels_start none" "torch.compile" "CCE" "GEMMs only, 4 (chunked)" --out $OUT/bench_real.json 2>&1 | grep "^|"
