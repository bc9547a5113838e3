#!/bin/bash
# GPT-2 through gpipe and back (make check-hf): a random tiny GPT2LMHeadModel made by
# transformers, `gpipe import`, 5 training steps on 2 stages from it (--init), `gpipe export`,
# GPT2LMHeadModel.from_pretrained on the export, and its logits against gpipe's for the trained
# checkpoint. Skips (exit 77) where transformers is not installed.
# Usage: tests/hf/roundtrip.sh BUILD_DIR [PYTHON]
set -euo pipefail
BUILD=${1:?usage: roundtrip.sh BUILD_DIR [PYTHON]}
PY=${2:-.pyenv/bin/python}
GPIPE=$BUILD/gpipe
HERE=$(cd "$(dirname "$0")" && pwd)
if ! "$PY" -c "import torch, transformers, safetensors" 2>/dev/null; then
    echo "check-hf: skipped: $PY cannot import torch, transformers and safetensors" \
         "(make pydeps-hf installs transformers over Debian's python3-torch)"
    exit 77
fi
W=$(mktemp -d /tmp/gpipe_hf.XXXXXX)
trap 'rm -rf "$W"' EXIT

"$PY" "$HERE/roundtrip.py" make "$W/model"
"$GPIPE" import --hf "$W/model" --out "$W/imported.safetensors" --config-out "$W/gpt2.json"
# token ids below the vocabulary of 100, as raw uint16
"$PY" -c "import torch; torch.manual_seed(3); \
torch.randint(0, 100, (4096,), dtype=torch.int16).numpy().astype('<u2').tofile('$W/ids.u16')"
"$GPIPE" train --model "$W/gpt2.json" --init "$W/imported.safetensors" --data "$W/ids.u16" \
    --data-format u16 --stages 2 --micro-batches 2 --batch 4 --steps 5 --lr 1e-3 \
    --checkpoint-dir "$W/ck" --quiet
CKPT="$W/ck/ckpt-00000005.safetensors"
"$GPIPE" export --checkpoint "$CKPT" --out "$W/export"
"$BUILD/gpt2_logits" "$CKPT" "$W/model/input.safetensors" "$W/gpipe_logits.safetensors"
"$PY" "$HERE/roundtrip.py" compare "$W/export" "$W/gpipe_logits.safetensors"
# training moved the weights: the export is not the model imported
if cmp -s "$W/model/model.safetensors" "$W/export/model.safetensors"; then
    echo "check-hf: the exported weights are the imported ones: training did not reach them"
    exit 1
fi
echo "check-hf: passed"
