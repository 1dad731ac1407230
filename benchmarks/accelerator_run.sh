#!/usr/bin/env bash
# benchmarks/accelerator_bench.py on the GPU machine that the `device` tool lends (JAX and PyTorch
# with CUDA, Python 3.12, no TensorFlow, no network): BENCHMARKS.md, "Accelerator".
#
#   1. here, where PyPI is reached, in the checkout the device tool sends (the session's own):
#        bash benchmarks/accelerator_run.sh fetch
#      downloads the wheels the machine lacks into .whl/ (in .gitignore, so carried explicitly):
#      Keras and its two missing needs, and the PyTorch peer's transformers 4.46 with the
#      tokenizers and huggingface-hub versions it accepts (the image has transformers 5, which
#      has no Transformer-XL, and newer tokenizers and huggingface-hub than 4.46 allows).
#   2. one device call, carry [".whl"], timeout_s 600:
#        bash benchmarks/accelerator_run.sh run
#      installs them into /tmp/site, prints the devices, and runs the harness on every preset,
#      dtype and phase, tfxl on JAX and the peer on PyTorch, writing $OUT/accelerator.json (after
#      every process, so a run cut short keeps what it measured) and $OUT/accelerator.log (with
#      the Markdown table). Extra arguments go to the harness (e.g. --presets enwik8_base).
#
# The training rows time tfxl-train's own step on JAX, `JaxTrainStep.train(n)` (one compiled host
# loop of n steps, weights, optimizer and memory donated, the language model's task, tfxl-train's
# optimizer and clipping) under `resolve_distribution("data_parallel")`, with its input from numpy
# in place of tf.data: the step and the distribution import no TensorFlow. The `tfxl-train`
# command itself cannot run here: this machine has no TensorFlow, nor can it be brought (the
# tensorflow-cpu 2.21 wheel alone is about 270 MB; a call carries at most 64 MiB, and nothing can
# be fetched there), and around the step the trainer reads tfxl-prepare's TFRecord streams
# through tf.data (tfxl/data/pipeline.py), writes TensorFlow-format checkpoints through
# tf.train.Checkpoint mirrors (tfxl/checkpoints/tree.py and training.py, and the training
# memory's, made at the first checkpoint), TensorBoard scalars through tf.summary
# (train/controller.py), and train/run.py, train/controller.py and train/preemption.py import
# TensorFlow at the top. The run says whether TensorFlow imports there.
# benchmarks/train_backends.py compares tfxl-train on TensorFlow and on JAX on a CPU
# (BENCHMARKS.md, "Training on TensorFlow and on JAX (CPU)").
set -euo pipefail
cd "$(dirname "$0")/.."

# The local .venv's Keras (setup.cfg pins 3.15), transformers 4.46.x as the `bench` extra, and
# the versions of their needs that those accept; nothing else is missing there (KINDS.md).
WHEELS=(keras==3.15.1 namex==0.1.0 optree==0.20.0 transformers==4.46.3 tokenizers==0.20.3
        huggingface-hub==0.36.2)

case "${1:-}" in
fetch)
    mkdir -p .whl
    "${PYTHON:-python3}" -m pip download --quiet --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
    ls -l .whl
    du -sh .whl
    ;;
run)
    shift
    out="${OUT:-/tmp/accelerator-out}"
    mkdir -p "$out"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD" KERAS_BACKEND=jax PYTHONUNBUFFERED=1
    nvidia-smi -L || true
    python3 -c "import jax, keras, torch, transformers; print('jax', jax.__version__, \
jax.devices(), '| keras', keras.__version__, '| torch', torch.__version__, \
torch.cuda.is_available(), '| transformers', transformers.__version__)"
    python3 -c "import tensorflow" 2>/dev/null && echo "tensorflow: importable" ||
        echo "tensorflow: not importable: the tfxl-train command cannot run here, its step" \
            "does (see this script's header)"
    # --budget_s: no process starts after 480 s, and the last is stopped then, so that the
    # results are written well inside the 600 s command limit.
    python3 -m benchmarks.accelerator_bench --peer on --budget_s 480 \
        --out "$out/accelerator.json" "$@" 2>&1 | tee "$out/accelerator.log"
    ;;
*)
    echo "usage: bash benchmarks/accelerator_run.sh fetch | run [accelerator_bench args]" >&2
    exit 2
    ;;
esac
