#!/usr/bin/env bash
# Optional: llama-cpp-python (real llama.cpp) for checking exported GGUF files and for k-quants, with its
# multimodal library (mtmd), which checks a vision-language model's mmproj file.
#   bash scripts/setup.sh --with-llama-cpp          # the default set-up, then this
#   VENV=/path/to/.venv bash scripts/setup_llama_cpp.sh   # this alone, into another venv
# The registry has only its source distribution, so pip compiles llama.cpp (about 10-15 min on
# 2 cores). The wheel is built once into a cache folder and reused by every later run and venv;
# only llama-cpp-python and its one missing dependency (diskcache) are installed, nothing upgraded.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
WHEELS="${TUNESMITH_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/tunesmith/wheels}"
PY="$VENV/bin/python"
# The mtmd module loads its shared library on import: a build without it (an earlier set-up) fails here.
if "$PY" -c "import llama_cpp, llama_cpp.mtmd_cpp, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
  echo "setup: llama-cpp-python $VERSION (with mtmd) already installed in $VENV"
  exit 0
fi
# A folder of its own: wheels built before mtmd was on sit in $WHEELS itself and are not picked up.
WHEELS="$WHEELS/mtmd"
mkdir -p "$WHEELS"
WHEEL="$(ls "$WHEELS"/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -n1 || true)"
if [[ -z "$WHEEL" ]]; then
  echo "setup: building llama-cpp-python $VERSION from source into $WHEELS (long: compiles llama.cpp)"
  # Only the libraries the Python package loads (llama, ggml, and mtmd: LLAVA_BUILD is the 0.3.36 CMakeLists' name
  # for it): no tests, examples, tools or server.
  export CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF}"
  export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
  "$PY" -m pip wheel --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
    -w "$WHEELS" "llama-cpp-python==$VERSION"
  WHEEL="$(ls "$WHEELS"/llama_cpp_python-"$VERSION"-*.whl | head -n1)"
fi
PIP=("$PY" -m pip install --disable-pip-version-check -q)
"${PIP[@]}" --no-deps --force-reinstall "$WHEEL"
# Its other dependencies (numpy, jinja2, typing-extensions) are already ours; add only what is missing.
"$PY" -c "import diskcache" 2>/dev/null || "${PIP[@]}" --no-deps "diskcache>=5.6.1"
echo "setup: llama-cpp-python $("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)') from $WHEEL"
