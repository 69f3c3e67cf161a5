#!/usr/bin/env bash
# bench/ml/venv.sh DIR [torch|all]: a Python virtualenv in DIR with what the training loaders
# need, from PyPI: "torch" (the CI test: PyTorch, Pillow, NumPy, crc32c) or "all" (also
# TensorFlow for the tf.data loader). Versions are pinned; a DIR that has them is left as it is.
# PyTorch's PyPI wheel brings its CUDA libraries (about 5 GB installed, about a minute here) and
# runs on the CPU; the wheel cannot be imported without them.
set -euo pipefail
dir=${1:?usage: venv.sh DIR [torch|all]}
set=${2:-all}
packages="torch==2.15.0 pillow==13.0.0 numpy==2.4.6 crc32c==2.9.post0"
[ "$set" = torch ] || packages="$packages tensorflow-cpu==2.21.0"
have=$(cat "$dir/cairn-packages" 2>/dev/null || true)
missing=$(for p in $packages; do case " $have " in *" $p "*) ;; *) echo "$p" ;; esac; done)
[ -n "$missing" ] || exit 0
python3 -c "import ensurepip" 2>/dev/null || apt-get install -y -q python3-venv >/dev/null
python3 -m venv "$dir"
# shellcheck disable=SC2086
"$dir/bin/pip" install -q --disable-pip-version-check $packages
echo "$packages" > "$dir/cairn-packages"
