#!/bin/bash
# The GPU checks, in one go, for a machine with an NVIDIA GPU: the GPU tests, the client cost of every strategy
# against FedAvg on the CNNs, the single- against the multi-tensor local training (model_cost.py --paths), the server
# evaluation's cost, and 2-client CNN federations with clients and server on cuda. Each step is time-boxed and
# independent, so one that fails leaves the others' results. Every client-cost row names its ratio to FedAvg in the
# same run (bayesadmm_ratio_to_fedavg, ...).
# Results in $OUT (default benchmarks/results/gpu/run-<time>); docs/results/cnns.md#on-a-gpu has the last ones.
#
#   bash benchmarks/gpu_checks.sh            # in the repository root, with the project installed (make install)
#
# On a machine that already has a CUDA torch but not the project, put the other wheels (flwr, ivon-opt, ...) in .whl/
# and the Fashion-MNIST files in .gpu/fmnist/ first: they are installed beside that torch (this is how the GPU
# sessions ran it). Each federation trains 2 clients on 6,000 images in all: FEDERATION_FRACTION=0.3 where only the
# first 20,000 training images could be carried (the H200 session), 0.1 with all 60,000 (the default).
#
# Settable, for a call with less device time: MODEL_COST_EXAMPLES (default "256 6000", "" for none), MODEL_COST_MODELS
# (comma-separated, default all); PATHS_MODELS (default mlp,cnn-acar,cnn-zenke,resnet20, "" for none) and
# PATHS_EXAMPLES (default 2000: the paths' per-step cost, 3 runs of each of 8 trainings a model); FEDERATIONS, entries
# model:strategy[:key=value,...] (default the four below); FEDERATION_CLIENTS / _ROUNDS / _SPLIT / _EPOCHS
# (default 2 / 3 / iid / 2). E.g. BayesADMM's IVON settings on the CNNs (issue 30, item 6):
#   MODEL_COST_EXAMPLES=256 FEDERATION_SPLIT=dirichlet FEDERATION_CLIENTS=3 FEDERATION_ROUNDS=6 \
#   FEDERATIONS="cnn-zenke:fedavg cnn-zenke:bayesadmm cnn-zenke:bayesadmm:beta2=0" bash benchmarks/gpu_checks.sh
set -u
OUT=${OUT:-benchmarks/results/gpu/run-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
T0=$(date +%s)
stamp() { echo; echo "=== +$(( $(date +%s) - T0 ))s $* | $(uptime)"; }
export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 PYTHONUNBUFFERED=1
stamp setup
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
    export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH
    printf '#!%s\nimport sys\nfrom fedbayes.deploy.cli import main\nsys.exit(main())\n' "$(command -v python3)" >/tmp/site/bin/fedbayes
    chmod +x /tmp/site/bin/fedbayes
fi
FMNIST=/usr/share/datasets/fashion-mnist
# Only onto a bare machine: never over a dataset that is already there.
if [ -d .gpu/fmnist ] && [ ! -e "$FMNIST" ]; then mkdir -p "$FMNIST" && cp .gpu/fmnist/* "$FMNIST/"; fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "no NVIDIA GPU here"; exit 2; }
python3 -c "import torch, flwr; assert torch.cuda.is_available(), 'torch sees no CUDA GPU'; print('torch', torch.__version__, torch.cuda.get_device_name(0), 'flwr', flwr.__version__)" || exit 2

stamp gpu tests
timeout 150 python3 -m pytest -q -p no:cacheprovider -rs tests/component/test_device_path.py \
    tests/component/test_evaluation.py tests/component/test_models_strategies.py 2>&1 | tail -25
# the two paths of IVON's step and of FedProx's term, equal on cuda
timeout 90 python3 -m pytest -q -p no:cacheprovider -rs -k cuda tests/unit/test_bayes_ivon.py \
    tests/unit/test_gradient_terms.py 2>&1 | tail -8

# model_cost.py merges into, and evaluation_cost.py overwrites, their file in benchmarks/results: an earlier one is
# kept in $OUT, and each run's file goes there too.
for earlier in model_cost-cuda.json "model_cost-paths-cuda-${PATHS_EXAMPLES:-2000}.json" evaluation_cost-cuda.json; do
    if [ -e "benchmarks/results/$earlier" ]; then mv "benchmarks/results/$earlier" "$OUT/earlier-$earlier"; fi
done
for examples in ${MODEL_COST_EXAMPLES-256 6000}; do
    stamp "model_cost $examples examples"
    timeout $(( examples > 1000 ? 420 : 300 )) python3 benchmarks/model_cost.py --device cuda --examples "$examples" \
        ${MODEL_COST_MODELS:+--models "$MODEL_COST_MODELS"} 2>&1 | grep -v INFO | tail -32
    mv benchmarks/results/model_cost-cuda.json "$OUT/model_cost-cuda-$examples.json"
done

if [ -n "${PATHS_MODELS-mlp,cnn-acar,cnn-zenke,resnet20}" ]; then
    stamp "model_cost --paths ${PATHS_EXAMPLES:-2000} examples"
    timeout 240 python3 benchmarks/model_cost.py --paths --device cuda --examples "${PATHS_EXAMPLES:-2000}" --repeats 2 \
        --models "${PATHS_MODELS-mlp,cnn-acar,cnn-zenke,resnet20}" 2>&1 | grep -v INFO | tail -36
    mv "benchmarks/results/model_cost-paths-cuda-${PATHS_EXAMPLES:-2000}.json" "$OUT/"
fi

stamp evaluation_cost
timeout 90 python3 benchmarks/evaluation_cost.py --device cuda --threads 1 2>&1 | tail -8
mv benchmarks/results/evaluation_cost-cuda.json "$OUT/"

for run in ${FEDERATIONS:-cnn-acar:fedavg cnn-acar:bayesadmm cnn-zenke:bayesadmm resnet20:bayesadmm}; do
    IFS=: read -r model strategy keys <<<"$run"
    stamp "federation $model $strategy $keys"
    sets=()
    for kv in ${keys//,/ }; do sets+=(--set "$kv"); done
    workdir=$(mktemp -d)/run
    timeout 120 fedbayes local --strategy "$strategy" --clients "${FEDERATION_CLIENTS:-2}" \
        --rounds "${FEDERATION_ROUNDS:-3}" --fraction "${FEDERATION_FRACTION:-0.1}" --split "${FEDERATION_SPLIT:-iid}" \
        --workdir "$workdir" --parallel-tasks 2 --set model="$model" --set device=cuda \
        --set local-epochs="${FEDERATION_EPOCHS:-2}" --set batch-size=64 --set eval-every=1 --set eval-fraction=1 \
        --set ensemble-samples=32 "${sets[@]}" 2>&1 | tail -12
    cp "$workdir/results.jsonl" "$OUT/federation-$model-$strategy${keys:+-${keys//[=,]/_}}.jsonl"
done
stamp done
