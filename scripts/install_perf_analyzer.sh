#!/bin/sh
# Install Triton's perf_analyzer into one known folder, without touching any Python env.
#
#   scripts/install_perf_analyzer.sh [DEST]      (DEST defaults to build/perf_analyzer)
#
# The PyPI package `perf-analyzer` is a placeholder: the real binary ships inside the
# tritonclient 2.41.1 manylinux wheel (tritonclient-2.41.1.data/data/bin/perf_analyzer).
# It links libb64 (Debian's libb64-0d, installed with apt-get when missing and run as
# root) and libcudart.so.12 (from the nvidia-cuda-runtime-cu12 wheel; no GPU is needed).
# Both wheels are downloaded and unpacked, never installed. The result:
#   DEST/bin/perf_analyzer   the binary
#   DEST/lib/libcudart.so.12
#   DEST/perf_analyzer       a wrapper that sets LD_LIBRARY_PATH: run this one
# benchmarks/loadgen/perf_analyzer.py and tests/clients/test_perf_analyzer.py find it
# there, or wherever INFERPOOL_PERF_ANALYZER points.
set -eu

TRITONCLIENT=2.41.1
CUDA_RUNTIME=12.9.79
DEST=${1:-build/perf_analyzer}
PYTHON=${PYTHON:-python3}

if ! ldconfig -p | grep -q 'libb64\.so\.0d'; then
    # apt_install.sh waits for another apt run (.ci/run's background installs) to end.
    sh "$(dirname "$0")/apt_install.sh" perf_analyzer libb64-0d
fi

mkdir -p "$DEST/bin" "$DEST/lib"
DEST=$(cd "$DEST" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux1_x86_64 --python-version 3 -d "$work" "tritonclient==$TRITONCLIENT"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux2014_x86_64 --python-version 3 -d "$work" \
    "nvidia-cuda-runtime-cu12==$CUDA_RUNTIME"

"$PYTHON" - "$work" "$DEST" "$TRITONCLIENT" <<'EOF'
import pathlib, stat, sys, zipfile

work, dest, version = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
members = {
    "tritonclient-": (f"tritonclient-{version}.data/data/bin/perf_analyzer", "bin/perf_analyzer"),
    "nvidia_cuda_runtime_cu12-": ("nvidia/cuda_runtime/lib/libcudart.so.12", "lib/libcudart.so.12"),
}
for prefix, (member, target) in members.items():
    (wheel,) = work.glob(prefix + "*.whl")
    with zipfile.ZipFile(wheel) as archive:
        path = dest / target
        path.write_bytes(archive.read(member))
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
EOF

cat > "$DEST/perf_analyzer" <<EOF
#!/bin/sh
LD_LIBRARY_PATH="$DEST/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$DEST/bin/perf_analyzer" "\$@"
EOF
chmod +x "$DEST/perf_analyzer"
"$DEST/perf_analyzer" --version >/dev/null 2>&1 || "$DEST/perf_analyzer" --help >/dev/null 2>&1 || {
    echo "perf_analyzer does not start: $DEST/perf_analyzer" >&2
    exit 1
}
echo "$DEST/perf_analyzer"
