# Sourced at the start of every device call: install the carried wheels (pydantic and its needs, which
# the GPU image lacks) into /tmp/site and put them and the repository on PYTHONPATH; where .quack/ is carried
# (scripts/pack_quack.sh), unpack the quack extra too. Its .pth file is not processed outside site's own
# directories, so the CuTe DSL's packages go on the path here.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
# The archive and the wheels together exceed one transfer: carry .quack/ in one call, and the machine, while it stays
# warm, keeps it unpacked for the next calls.
quack=/tmp/quack/site-packages
if [ -f .quack/site-packages.tar.xz ] && [ ! -d "$quack" ]; then
    mkdir -p /tmp/quack && tar -C /tmp/quack -xJf .quack/site-packages.tar.xz || exit 1
fi
if [ -d "$quack" ]; then
    export PYTHONPATH=$PYTHONPATH:$quack:$quack/nvidia_cutlass_dsl/dsl_packages
fi
export PYTHONUNBUFFERED=1 COLUMNS=160
